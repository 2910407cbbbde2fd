// Admins' review queue (#/market/review): public items waiting for approval, each with
// approve and reject (POST /api/v2/marketplace/items/<id>/review) and a note for its owner.

import { api, get, session } from "../api.js";
import { announce, clear, errorBox, fmtTime, h, pageTitle, table } from "../dom.js";
import { ITEMS, itemPath } from "./market.js";

export async function render(main) {
  const list = h("div", { id: "review-queue" });
  const status = h("div", { role: "status" });
  async function load() {
    const got = await get(`${ITEMS}?approval=pending&sort=recent`);
    clear(list, got.items.length ? h("div", { class: "table-wrap" }, table(["item", "owner", "kind", "updated", "note", ""], got.items.map((item) => {
      const note = h("input", { "aria-label": `note for ${item.name}`, maxlength: "512", class: "review-note" });
      const act = (decision) => async () => {
        try {
          await api("POST", `${itemPath(item.id)}/review`, { body: { decision, note: note.value } });
          clear(status, h("div", { class: "ok-box" }, `${decision === "approve" ? "Approved" : "Rejected"} ${item.name}`));
          announce(`${decision === "approve" ? "Approved" : "Rejected"} ${item.name}`);
          await load();
        } catch (err) { clear(status, errorBox(err)); }
      };
      return h("tr", { dataset: { item: item.id } },
        h("th", { scope: "row" }, h("a", { href: `#/market/item/${encodeURIComponent(item.id)}` }, item.name)),
        h("td", {}, item.owner), h("td", {}, item.kind), h("td", {}, fmtTime(item.updatedAt * 1000)), h("td", {}, note),
        h("td", {}, h("div", { class: "toolbar" },
          h("button", { type: "button", class: "small primary", "aria-label": `approve ${item.name}`, onclick: act("approve") }, "Approve"),
          h("button", { type: "button", class: "small danger", "aria-label": `reject ${item.name}`, onclick: act("reject") }, "Reject"))));
    }))) : h("p", { class: "muted", id: "review-empty" }, "No item waits for review."));
  }
  if (!session.me || !session.me.admin) {
    clear(main, pageTitle("Review queue"), errorBox("Only admins review marketplace items."));
    return;
  }
  clear(main, pageTitle("Marketplace review queue"),
    h("p", { class: "muted" }, "Public items stay hidden from others until approved. Read each one before approving it."),
    status, list);
  await load();
}
