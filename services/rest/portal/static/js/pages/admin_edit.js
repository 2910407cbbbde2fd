// The admin page's editors: one user (email, admin, groups), one group (description,
// external name for OIDC sign-in, admin flag, VCs and storages granted), and the storages
// with their grants. Each saves through the public API (PUT /api/v2/users/{u},
// /groups/{g}, /storages/{s}); a refusal is shown with the field the API names.

import { api, get } from "../api.js";
import { clear, h, table } from "../dom.js";

const BUILTIN = new Set(["admin", "default"]);

function checkboxes(prefix, label, names, chosen) {
  const boxes = names.map((n) => {
    const box = h("input", { type: "checkbox", id: `${prefix}-${n}`, value: n, checked: chosen.includes(n) });
    return h("label", { class: "inline", for: box.id }, box, n);
  });
  const group = h("fieldset", { class: "checks", id: prefix }, h("legend", {}, label),
    boxes.length ? h("div", { class: "filters" }, boxes) : h("p", { class: "muted" }, "none"));
  group.chosen = () => [...group.querySelectorAll("input:checked")].map((b) => b.value);
  return group;
}

function panel(box, titleText, form) {
  clear(box, h("div", { class: "card" }, h("h3", { tabindex: "-1", class: "editor-title" }, titleText), form));
  box.querySelector(".editor-title").focus();
}

// After a save the editor goes: the keyboard goes back to the Edit button of what was saved.
function refocus(label) {
  const button = [...document.querySelectorAll("button[aria-label]")].find((b) => b.getAttribute("aria-label") === label);
  if (button) button.focus();
}

function field(label, control) { return h("div", { class: "field" }, h("label", { for: control.id }, label), control); }

export function userEditor(box, user, groups, { say, done }) {
  const email = h("input", { id: "eu-email", type: "email", value: user.email || "", size: "30" });
  const admin = h("input", { id: "eu-admin", type: "checkbox", checked: user.admin });
  // The admin group is the admin flag (OpenPAI's `admin` is its membership).
  const names = groups.map((g) => g.groupname).filter((n) => n !== "admin");
  const member = checkboxes("eu-groups", "Groups", names, user.grouplist);
  const problem = h("div");
  panel(box, `Edit user ${user.username}`, h("form", { "aria-label": `Edit user ${user.username}`, onsubmit: async (e) => {
    e.preventDefault();
    clear(problem);
    try {
      await api("PUT", `/api/v2/users/${encodeURIComponent(user.username)}`, { body: { email: email.value.trim(), admin: admin.checked, grouplist: member.chosen() } });
      say(`saved the user ${user.username}`);
      clear(box);
      await done();
      refocus(`edit user ${user.username}`);
    } catch (err) { problem.append(h("div", { class: "error-box", role: "alert" }, err.message)); }
  } },
  h("div", { class: "filters" }, field("Email", email), h("label", { class: "inline", for: "eu-admin" }, admin, "Admin")),
  member, problem,
  h("div", { class: "toolbar" }, h("button", { type: "submit", class: "primary" }, "Save user"), h("button", { type: "button", onclick: () => clear(box) }, "Cancel"))));
}

// `group` null: a new one.
export function groupEditor(box, group, known, { say, done }) {
  const acls = (group && group.extension && group.extension.acls) || {};
  const name = h("input", { id: "eg-name", value: group ? group.groupname : "", required: true, size: "20", autocomplete: "off", disabled: Boolean(group) });
  const description = h("input", { id: "eg-description", value: (group && group.description) || "", size: "40" });
  const external = h("input", { id: "eg-external", value: (group && group.externalName) || "", size: "30", placeholder: "the directory's group, e.g. sg-research" });
  const admin = h("input", { id: "eg-admin", type: "checkbox", checked: Boolean(acls.admin), disabled: group && BUILTIN.has(group.groupname) });
  const vcs = checkboxes("eg-vcs", "Virtual clusters", [...new Set([...known.vcs, ...(acls.virtualClusters || [])])], acls.virtualClusters || []);
  const storages = checkboxes("eg-storages", "Storages", [...new Set([...known.storages, ...(acls.storageConfigs || [])])], acls.storageConfigs || []);
  const problem = h("div");
  const title = group ? `Edit group ${group.groupname}` : "Add a group";
  panel(box, title, h("form", { "aria-label": title, onsubmit: async (e) => {
    e.preventDefault();
    clear(problem);
    const extension = { acls: { ...acls, admin: admin.checked, virtualClusters: vcs.chosen(), storageConfigs: storages.chosen() } };
    const body = { description: description.value.trim(), externalName: external.value.trim(), extension };
    try {
      if (group) await api("PUT", `/api/v2/groups/${encodeURIComponent(group.groupname)}`, { body });
      else await api("POST", "/api/v2/groups", { body: { groupname: name.value.trim(), ...body } });
      say(`saved the group ${group ? group.groupname : name.value.trim()}`);
      clear(box);
      await done();
      refocus(`edit group ${group ? group.groupname : name.value.trim()}`);
    } catch (err) { problem.append(h("div", { class: "error-box", role: "alert" }, err.message)); }
  } },
  h("div", { class: "filters" }, field("Group name", name), field("Description", description), field("External name (OIDC)", external),
    h("label", { class: "inline", for: "eg-admin" }, admin, "Members are admins")),
  vcs, storages, problem,
  h("div", { class: "toolbar" }, h("button", { type: "submit", class: "primary" }, "Save group"), h("button", { type: "button", onclick: () => clear(box) }, "Cancel"))));
}

const DATA_FIELDS = { hostPath: ["path"], nfs: ["server", "path", "hostPath"], pvc: ["claimName", "hostPath"] };

// The storages (admins see every one), each with the groups that grant it; add, edit, delete.
export async function storageSection(box, { say, done }) {
  const [{ storages }, groups] = await Promise.all([get("/api/v2/storages"), get("/api/v2/groups")]);
  const grants = (name) => groups.filter((g) => ((g.extension && g.extension.acls && g.extension.acls.storageConfigs) || []).includes(name)).map((g) => g.groupname);
  const editor = h("div", { id: "storage-editor" });

  async function edit(summary) {
    const s = summary ? await get(`/api/v2/storages/${encodeURIComponent(summary.name)}`) : { type: "hostPath", data: {}, mountOptions: [] };
    const name = h("input", { id: "es-name", value: s.name || "", required: true, size: "20", autocomplete: "off", disabled: Boolean(summary) });
    const type = h("select", { id: "es-type" }, ["hostPath", "nfs", "pvc"].map((t) => h("option", { value: t, selected: t === s.type }, t)));
    const dataBox = h("div", { class: "filters" });
    const data = {};
    const drawData = () => clear(dataBox, DATA_FIELDS[type.value].map((k) => {
      data[k] = data[k] || h("input", { id: `es-data-${k}`, value: (s.data && s.data[k]) || "", size: "28", autocomplete: "off" });
      return field(`data.${k}`, data[k]);
    }));
    type.addEventListener("change", drawData);
    drawData();
    const defaultPath = s.name ? `/mnt/${s.name}` : "";
    const mountPath = h("input", { id: "es-mount", value: s.mountPath && s.mountPath !== defaultPath ? s.mountPath : "", size: "24", placeholder: "/mnt/<name>" });
    const readOnly = h("input", { id: "es-readonly", type: "checkbox", checked: Boolean(s.readOnly) });
    const isDefault = h("input", { id: "es-default", type: "checkbox", checked: Boolean(s.default) });
    const description = h("input", { id: "es-description", value: s.description || "", size: "40" });
    const granted = checkboxes("es-groups", "Granted to groups", groups.map((g) => g.groupname), s.name ? grants(s.name) : []);
    const problem = h("div");
    const title = summary ? `Edit storage ${summary.name}` : "Add a storage";
    panel(editor, title, h("form", { "aria-label": title, onsubmit: async (e) => {
      e.preventDefault();
      clear(problem);
      const n = name.value.trim();
      const body = { type: type.value, data: Object.fromEntries(DATA_FIELDS[type.value].map((k) => [k, data[k].value.trim()]).filter(([, v]) => v)),
        mountPath: mountPath.value.trim(), readOnly: readOnly.checked, default: isDefault.checked, description: description.value.trim(),
        mountOptions: s.mountOptions || [] };
      try {
        await api("PUT", `/api/v2/storages/${encodeURIComponent(n)}`, { body });
        // Grants live in the groups (extension.acls.storageConfigs): change those that differ.
        const want = new Set(granted.chosen());
        for (const g of groups) {
          const a = (g.extension && g.extension.acls) || {};
          const has = (a.storageConfigs || []).includes(n);
          if (has === want.has(g.groupname)) continue;
          const storageConfigs = has ? a.storageConfigs.filter((x) => x !== n) : [...(a.storageConfigs || []), n];
          await api("PUT", `/api/v2/groups/${encodeURIComponent(g.groupname)}`, { body: { extension: { acls: { ...a, storageConfigs } } } });
        }
        say(`saved the storage ${n}`);
        clear(editor);
        await done();
        refocus(`edit storage ${n}`);
      } catch (err) { problem.append(h("div", { class: "error-box", role: "alert" }, err.message)); }
    } },
    h("div", { class: "filters" }, field("Storage name", name), field("Type", type)), dataBox,
    h("div", { class: "filters" }, field("Mount path", mountPath), field("Description", description),
      h("label", { class: "inline", for: "es-readonly" }, readOnly, "Read-only"), h("label", { class: "inline", for: "es-default" }, isDefault, "Default (mounted when a job names none)")),
    granted, problem,
    h("div", { class: "toolbar" }, h("button", { type: "submit", class: "primary" }, "Save storage"), h("button", { type: "button", onclick: () => clear(editor) }, "Cancel"))));
  }

  clear(box,
    storages.length ? h("div", { class: "table-wrap" }, table(["storage", "type", "mount path", "read-only", "default", "granted to", ""], storages.map((s) =>
      h("tr", { dataset: { storage: s.name } }, h("th", { scope: "row" }, s.name), h("td", {}, s.type), h("td", {}, h("code", {}, s.mountPath)),
        h("td", {}, s.readOnly ? "yes" : "no"), h("td", {}, s.default ? "yes" : "no"), h("td", { class: "grants" }, grants(s.name).join(", ") || "nobody"),
        h("td", {}, h("button", { type: "button", class: "small", "aria-label": `edit storage ${s.name}`, onclick: () => edit(s) }, "Edit"), " ",
          h("button", { type: "button", class: "small danger", "aria-label": `delete storage ${s.name}`, onclick: async () => {
            if (!confirm(`Delete the storage ${s.name}? Jobs already accepted keep theirs.`)) return;
            try { await api("DELETE", `/api/v2/storages/${encodeURIComponent(s.name)}`); say(`deleted the storage ${s.name}`); await done(); } catch (err) { say(err.message, true); }
          } }, "Delete")))), { id: "storages" }))
      : h("p", { class: "muted", id: "no-storages" }, "No storage is declared."),
    h("div", { class: "toolbar" }, h("button", { type: "button", id: "storage-add", onclick: () => edit(null) }, "Add a storage")),
    editor);
}
