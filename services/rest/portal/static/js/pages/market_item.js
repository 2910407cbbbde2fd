// One marketplace item (#/market/item/<id>): its description (rendered by the server with
// raw HTML left out, and rebuilt here element by element from an allow-list, never with
// innerHTML), its parameters with "Use", star, export, edit and delete for its owner, and
// an admin's approve and reject for a public item.

import { api, get, session } from "../api.js";
import { announce, clear, errorBox, fmtTime, h, pageTitle } from "../dom.js";
import { itemPath, starButton, visibilityBadge } from "./market.js";

const TAGS = new Set(["h1", "h2", "h3", "h4", "h5", "h6", "p", "ul", "ol", "li", "code", "pre", "em", "strong", "a",
  "blockquote", "table", "thead", "tbody", "tr", "th", "td", "hr", "br", "img", "del", "s"]);
const ATTRS = { a: ["href", "title"], img: ["src", "alt", "title"], ol: ["start"], code: ["class"] };
const SAME_ORIGIN_IMAGE = /^(data:image\/(png|gif|jpeg|webp);|\/(?!\/)|\.{0,2}\/)/i;
const SAFE_URL = /^(https?:|mailto:|#|\/(?!\/)|\.{0,2}\/|[^:/?#]*(?:[/?#]|$))/i;

// The server's HTML as DOM nodes: allowed elements and attributes only; anything else
// keeps its text. Headings move two levels down, under the page's own h1 and h2.
export function safeFragment(html) {
  const doc = new DOMParser().parseFromString(`<body>${html}</body>`, "text/html");
  const out = document.createDocumentFragment();
  const copy = (node, into) => {
    for (const child of node.childNodes) {
      if (child.nodeType === Node.TEXT_NODE) { into.append(document.createTextNode(child.textContent)); continue; }
      if (child.nodeType !== Node.ELEMENT_NODE) continue;
      const tag = child.tagName.toLowerCase();
      if (!TAGS.has(tag)) { copy(child, into); continue; }
      if (tag === "img" && !SAME_ORIGIN_IMAGE.test((child.getAttribute("src") || "").trim())) {
        // The portal loads nothing from elsewhere (its CSP: img-src 'self' data:): a link instead.
        const src = (child.getAttribute("src") || "").trim();
        into.append(SAFE_URL.test(src) ? Object.assign(document.createElement("a"), { href: src, rel: "noopener noreferrer nofollow", target: "_blank", textContent: child.getAttribute("alt") || src }) : document.createTextNode(child.getAttribute("alt") || ""));
        continue;
      }
      const shifted = /^h[1-6]$/.test(tag) ? `h${Math.min(6, Number(tag[1]) + 2)}` : tag;
      const el = document.createElement(shifted);
      for (const name of ATTRS[tag] || []) {
        const value = child.getAttribute(name);
        if (value === null) continue;
        if ((name === "href" || name === "src") && !SAFE_URL.test(value.trim())) continue;
        el.setAttribute(name, value);
      }
      if (tag === "a") { el.setAttribute("rel", "noopener noreferrer nofollow"); if (/^https?:/i.test(el.getAttribute("href") || "")) el.setAttribute("target", "_blank"); }
      into.append(el);
      copy(child, el);
    }
  };
  copy(doc.body, out);
  return out;
}

function useForm(item, go, dataItems) {
  const names = Object.keys(item.parameters || {});
  const inputs = names.map((name, i) => {
    const id = `use-param-${i}`;
    const input = h("input", { id, value: item.parameters[name], dataset: { param: name }, class: "use-param" });
    return h("div", { class: "field" }, h("label", { for: id }, name), input);
  });
  // A data prerequisite of the template may take the uri of a data item the user sees.
  const slots = Object.entries(item.data || {}).map(([slot, uris], i) => {
    const id = `use-data-${i}`;
    const select = h("select", { id, dataset: { slot }, class: "use-data" },
      h("option", { value: "" }, `as written: ${uris.join(", ") || "none"}`),
      dataItems.map((d) => h("option", { value: d.id }, `${d.name} (${d.id})`)));
    return h("div", { class: "field" }, h("label", { for: id }, `data: ${slot}`), select);
  });
  const form = h("form", { id: "use-form", class: "card", "aria-labelledby": "use-title", onsubmit: (e) => {
    e.preventDefault();
    const q = new URLSearchParams({ market: item.id });
    for (const input of form.querySelectorAll(".use-param")) {
      if (input.value !== item.parameters[input.dataset.param]) q.set(`p.${input.dataset.param}`, input.value);
    }
    for (const select of form.querySelectorAll(".use-data")) if (select.value) q.set(`d.${select.dataset.slot}`, select.value);
    go(`/submit?${q}`);
  } },
  h("h2", { id: "use-title" }, "Use this template"),
  names.length ? h("p", { class: "hint" }, "Change a parameter here or on the submit page; the job records this item.")
    : h("p", { class: "hint" }, "It has no parameters; the submit page opens with it filled in."),
  h("div", { class: "filters" }, inputs, slots),
  h("div", { class: "toolbar" }, h("button", { type: "submit", class: "primary", id: "use" }, "Use")));
  return form;
}

async function download(item) {
  const res = await api("GET", `${itemPath(item.id)}/export`, { raw: true });
  const url = URL.createObjectURL(new Blob([await res.text()], { type: "text/yaml" }));
  const a = h("a", { href: url, download: `${item.id}.yaml` });
  document.body.append(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function reviewBox(item, reload) {
  const note = h("input", { id: "review-note", maxlength: "512", placeholder: "a note for its owner", value: item.reviewNote || "" });
  const act = (decision) => async () => {
    try {
      await api("POST", `${itemPath(item.id)}/review`, { body: { decision, note: note.value } });
      announce(`${decision === "approve" ? "Approved" : "Rejected"} ${item.name}`);
      await reload();
    } catch (err) { announce(err.message); alert(err.message); }
  };
  return h("section", { class: "card", "aria-labelledby": "review-title", id: "review" },
    h("h2", { id: "review-title" }, "Review"),
    h("p", {}, `Approval: ${item.approval}`, item.reviewedBy ? ` by ${item.reviewedBy}` : "", item.reviewNote ? ` — ${item.reviewNote}` : ""),
    h("div", { class: "field" }, h("label", { for: "review-note" }, "Note"), note),
    h("div", { class: "toolbar" },
      h("button", { type: "button", class: "primary", id: "approve", onclick: act("approve") }, "Approve"),
      h("button", { type: "button", class: "danger", id: "reject", onclick: act("reject") }, "Reject")));
}

export async function render(main, { args, go }) {
  const id = args[0];
  async function load() {
    const item = await get(itemPath(id));
    const dataItems = item.kind === "template" && Object.keys(item.data || {}).length
      ? (await get("/api/v2/marketplace/items?kind=data&sort=name")).items : [];
    const actions = h("div", { class: "toolbar" }, starButton(item),
      h("button", { type: "button", id: "export", onclick: () => download(item).catch((err) => alert(err.message)) }, "Export (v2 YAML)"),
      item.mayChange ? h("a", { class: "button", id: "edit", href: `#/market/edit/${encodeURIComponent(item.id)}` }, "Edit") : null,
      item.mayChange ? h("button", { type: "button", class: "danger", id: "delete", onclick: async () => {
        if (!confirm(`Delete ${item.name}? Jobs made from it keep running.`)) return;
        try { await api("DELETE", itemPath(item.id)); announce(`Deleted ${item.name}`); go("/market"); } catch (err) { alert(err.message); }
      } }, "Delete") : null);
    const description = h("div", { class: "market-description", id: "market-description" });
    description.append(safeFragment(item.descriptionHtml || ""));
    clear(main, pageTitle(item.name),
      h("p", { class: "muted" }, `${item.kind === "data" ? "Data" : "Template"} · ${item.category} · by ${item.owner} · updated ${fmtTime(item.updatedAt * 1000)} · ${item.submits} ${item.submits === 1 ? "job" : "jobs"}`),
      h("p", { class: "market-tags" }, visibilityBadge(item), item.tags.map((t) => h("a", { class: "tag", href: `#/market?tag=${encodeURIComponent(t)}` }, t))),
      item.visibility === "public" && item.approval !== "approved" ? h("p", { class: "note", id: "approval-note" },
        item.approval === "pending" ? "Waiting for an admin's approval: only its owner and admins see it." : `Rejected${item.reviewNote ? `: ${item.reviewNote}` : ""}. Change it to ask again.`) : null,
      actions,
      item.summary ? h("p", { class: "lead" }, item.summary) : null,
      h("div", { class: "two market-item" },
        h("section", { "aria-labelledby": "about-title" }, h("h2", { id: "about-title" }, "About"), description),
        h("div", { class: "stack" },
          item.kind === "template" ? useForm(item, go, dataItems)
            : h("section", { class: "card", "aria-labelledby": "data-title" }, h("h2", { id: "data-title" }, "Where the data is"),
              h("p", {}, h("code", { id: "data-uri" }, item.uri)),
              h("p", { class: "hint" }, "Refer to it from a template's prerequisites: ", h("code", {}, "type: data"), ", ", h("code", {}, `uri: [${item.uri}]`), ", and ", h("code", {}, "<% $data.uri[0] %>"), " in a command.")),
          session.me && session.me.admin && item.visibility === "public" ? reviewBox(item, load) : null)),
      item.kind === "template" ? h("details", {}, h("summary", {}, "The template (OpenPAI v2 YAML)"), h("pre", { class: "code", id: "market-protocol" }, item.protocol)) : null);
  }
  try { await load(); } catch (err) { clear(main, pageTitle("Marketplace item"), errorBox(err), h("p", {}, h("a", { href: "#/market" }, "Back to the marketplace"))); }
}
