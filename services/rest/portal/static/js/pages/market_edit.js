// Publish or change a marketplace item (#/market/new, #/market/new?from=<job>, #/market/edit/<id>):
// a template (its OpenPAI v2 YAML) or a data item (its storage path or URI), its Markdown
// description, tags, category, and who sees it. The API's refusal names the field; the
// form marks it.

import { api, get, jobPath, session } from "../api.js";
import { announce, clear, h, pageTitle } from "../dom.js";
import { EXAMPLES } from "../examples.js";
import { itemPath, ITEMS } from "./market.js";

export async function render(main, { args, params, go }) {
  const editing = args[0] || null;
  const item = editing ? await get(itemPath(editing)) : {
    name: "", kind: "template", summary: "", description: "", category: "training", tags: [], visibility: "private", groups: [],
    protocol: EXAMPLES.hello, uri: "",
  };
  const fromJob = params.get("from");
  if (!editing && fromJob) {  // "save as template" from a job's page
    item.protocol = await api("GET", `${jobPath(fromJob)}/config`, { accept: "text/yaml" });
    item.name = fromJob.split("~").slice(1).join("~");
  }
  const result = h("div", { role: "alert", id: "market-edit-result" });
  const input = (id, label, attrs, hint) => {
    const el = h(attrs.tag || "input", { ...attrs, tag: null, id: `me-${id}` });
    return [el, h("div", { class: "field", dataset: { field: id } }, h("label", { for: `me-${id}` }, label), el, hint ? h("span", { class: "hint" }, hint) : null)];
  };
  const [name, nameField] = input("name", "Name", { value: item.name, required: true, maxlength: "64" });
  const [summary, summaryField] = input("summary", "Summary", { value: item.summary, maxlength: "256" }, "One line for the list.");
  const [category, categoryField] = input("category", "Category", { value: item.category, required: true, maxlength: "32", list: "me-categories" });
  const [tags, tagsField] = input("tags", "Tags", { value: item.tags.join(", ") }, "Comma-separated, e.g. pytorch, nlp.");
  const [description, descriptionField] = input("description", "Description (Markdown)", { tag: "textarea", rows: "10", class: "code", spellcheck: "true" });
  description.value = item.description;
  const [protocol, protocolField] = input("protocol", "Template (OpenPAI v2 YAML, with its parameters)", { tag: "textarea", rows: "16", class: "code", spellcheck: "false", wrap: "off" });
  protocol.value = item.protocol || "";
  const [uri, uriField] = input("uri", "Storage path or URI", { value: item.uri || "", maxlength: "1024", placeholder: "/mnt/team/datasets/imagenet or nfs://server/path" });
  const kinds = ["template", "data"].map((k) => h("label", {}, h("input", { type: "radio", name: "kind", value: k, checked: item.kind === k, disabled: !!editing }), ` ${k === "template" ? "job template" : "data"}`));
  const showKind = () => {
    const data = main.querySelector('input[name="kind"]:checked').value === "data";
    protocolField.hidden = data; uriField.hidden = !data;
  };
  const myGroups = (session.me && session.me.grouplist) || [];
  const groupBoxes = [...new Set([...myGroups, ...item.groups])].map((g) => h("label", {}, h("input", { type: "checkbox", class: "me-group", value: g, checked: item.groups.includes(g) }), ` ${g}`));
  const visibilities = [["private", "Only me"], ["groups", "Members of these groups"], ["public", "Everyone, once an admin approves it"]].map(([v, t]) =>
    h("label", { class: "stack-item" }, h("input", { type: "radio", name: "visibility", value: v, checked: item.visibility === v }), ` ${t}`));

  function mark(errors) {
    for (const el of main.querySelectorAll("[data-field].invalid")) el.classList.remove("invalid");
    for (const e of errors) {
      const root = (e.path || "").split(/[.[]/)[0];
      const field = main.querySelector(`[data-field="${root}"]`);
      if (field) field.classList.add("invalid");
    }
  }

  async function save(e) {
    e.preventDefault();
    clear(result);
    const kind = main.querySelector('input[name="kind"]:checked').value;
    const visibility = main.querySelector('input[name="visibility"]:checked').value;
    const body = {
      name: name.value.trim(), kind, summary: summary.value.trim(), description: description.value, category: category.value.trim(),
      tags: tags.value.split(",").map((t) => t.trim()).filter(Boolean), visibility,
      groups: visibility === "groups" ? [...main.querySelectorAll(".me-group:checked")].map((b) => b.value) : [],
      protocol: kind === "template" ? protocol.value : "", uri: kind === "data" ? uri.value.trim() : "",
    };
    if (editing) delete body.kind;
    try {
      const saved = editing ? await api("PUT", itemPath(editing), { body }) : await api("POST", ITEMS, { body });
      announce(`Saved ${saved.name}`);
      go(`/market/item/${encodeURIComponent(saved.id)}`);
    } catch (err) {
      const errors = (err.body && err.body.details && err.body.details.errors) || [];
      mark(errors);
      result.append(h("div", { class: "error-box" }, err.message, errors.length > 1 ? h("ul", {}, errors.map((x) => h("li", {}, h("code", {}, x.path), " ", x.message))) : null));
      announce(`Not saved: ${err.message}`);
    }
  }

  clear(main, pageTitle(editing ? `Edit ${item.name}` : "Publish to the marketplace"),
    h("form", { id: "market-edit", class: "stack", onsubmit: save },
      h("fieldset", {}, h("legend", {}, "Kind"), kinds),
      nameField, summaryField, categoryField,
      h("datalist", { id: "me-categories" }, ["training", "inference", "batch", "tuning", "data", "other"].map((c) => h("option", { value: c }))),
      tagsField, descriptionField, protocolField, uriField,
      h("fieldset", { "data-field": "groups" }, h("legend", {}, "Who sees it"), visibilities,
        h("div", { class: "filters", id: "me-groups", "aria-label": "groups" }, groupBoxes.length ? groupBoxes : h("span", { class: "muted" }, "You are in no group."))),
      h("div", { class: "toolbar" },
        h("button", { type: "submit", class: "primary", id: "market-save" }, editing ? "Save" : "Publish"),
        h("a", { class: "button", href: editing ? `#/market/item/${encodeURIComponent(editing)}` : "#/market" }, "Cancel")),
      result));
  for (const radio of main.querySelectorAll('input[name="kind"]')) radio.addEventListener("change", showKind);
  showKind();
  if (!editing && fromJob) result.append(h("p", { class: "hint" }, `From job ${fromJob}. Secrets are not copied.`));
}
