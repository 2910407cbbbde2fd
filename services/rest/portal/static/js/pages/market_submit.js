// The submit page's start from a marketplace template (#/submit?market=<id>&p.<name>=<value>&d.<prerequisite>=<data item>):
// the job YAML the template makes with those parameters (POST .../render), which names the
// item in extras.marketplaceItem, so the job counts for it and its page links back.

import { api } from "../api.js";
import { h } from "../dom.js";
import { itemPath } from "./market.js";

export async function marketPrefill(params) {
  const id = params.get("market");
  if (!id) return null;
  const parameters = {};
  const data = {};
  for (const [k, v] of params) {
    if (k.startsWith("p.")) parameters[k.slice(2)] = v;
    if (k.startsWith("d.")) data[k.slice(2)] = v;
  }
  const got = await api("POST", `${itemPath(id)}/render`, { body: { parameters, data } });
  return {
    text: got.jobs[0].config,
    note: h("p", { class: "hint", id: "from-market" }, "From the marketplace template ",
      h("a", { href: `#/market/item/${encodeURIComponent(id)}` }, id), ". Change its parameters below, then submit."),
  };
}

// A link back to the item a job was made from, for the job's page (null when none).
export function marketLink(itemId) {
  if (typeof itemId !== "string" || !itemId) return null;
  return h("a", { href: `#/market/item/${encodeURIComponent(itemId)}`, id: "job-market-item" }, `from marketplace item ${itemId}`);
}
