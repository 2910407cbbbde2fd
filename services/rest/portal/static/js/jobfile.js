// A job file out of the portal: "Export as YAML" (a download) and "Save as template"
// (a marketplace item), from the submit page's editor or a job's submitted config.

import { api } from "./api.js";
import { announce, clear, h } from "./dom.js";

// The marketplace's create-item route (docs/api.md, "Marketplace").
export const MARKET_ITEMS = "/api/v2/marketplace/items";

export function exportYaml(text, name) {
  const blob = new Blob([text], { type: "text/yaml" });
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: `${name || "job"}.yaml` });
  document.body.append(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 5000);
  announce(`Exported ${name || "job"}.yaml`);
}

// A small dialog asking what the template is, then the marketplace's create call; `out`
// shows the outcome. The item starts private (its owner shares or publishes it later).
export function saveAsTemplate(text, name, out) {
  const dialog = h("dialog", { class: "card", "aria-labelledby": "tpl-title" });
  const title = h("input", { id: "tpl-name", value: name || "", required: true, size: "30", autocomplete: "off" });
  const summary = h("input", { id: "tpl-summary", size: "50", autocomplete: "off" });
  const tags = h("input", { id: "tpl-tags", size: "30", autocomplete: "off", placeholder: "pytorch, cpu" });
  const category = h("input", { id: "tpl-category", size: "20", autocomplete: "off", value: "other" });
  const description = h("textarea", { id: "tpl-description", rows: "4", cols: "50" });
  const problem = h("div", { role: "alert" });
  const close = () => { dialog.close(); dialog.remove(); };
  const save = async (e) => {
    e.preventDefault();
    clear(problem);
    const body = { name: title.value.trim(), kind: "template", summary: summary.value.trim(), description: description.value,
      category: category.value.trim() || "other", tags: tags.value.split(",").map((t) => t.trim()).filter(Boolean), protocol: text };
    try {
      const item = await api("POST", MARKET_ITEMS, { body });
      close();
      const id = item && item.id;
      clear(out, h("div", { class: "ok-box" }, `Saved as the template ${body.name} (private). `,
        id ? h("a", { href: `#/market/item/${encodeURIComponent(id)}`, id: "template-link" }, "Open it in the marketplace") : ""));
      announce(`Saved as the template ${body.name}`);
    } catch (err) { problem.append(h("div", { class: "error-box" }, err.message)); }
  };
  dialog.append(h("form", { onsubmit: save },
    h("h2", { id: "tpl-title" }, "Save as a marketplace template"),
    h("div", { class: "field" }, h("label", { for: "tpl-name" }, "Template name"), title),
    h("div", { class: "field" }, h("label", { for: "tpl-summary" }, "Summary"), summary),
    h("div", { class: "field" }, h("label", { for: "tpl-tags" }, "Tags (comma-separated)"), tags),
    h("div", { class: "field" }, h("label", { for: "tpl-category" }, "Category"), category),
    h("div", { class: "field" }, h("label", { for: "tpl-description" }, "Description (Markdown)"), description),
    problem,
    h("div", { class: "toolbar" }, h("button", { type: "submit", class: "primary", id: "tpl-save" }, "Save template"),
      h("button", { type: "button", onclick: close }, "Cancel"))));
  dialog.addEventListener("cancel", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  title.focus();
}
