// The marketplace: job templates and data items people share (GET /api/v2/marketplace/items).
// Search, filter by tag, category and kind, star; each card opens the item's page
// (js/pages/market_item.js), where "Use" opens the submit page with the template filled in.

import { api, get, session } from "../api.js";
import { announce, clear, errorBox, h, pageTitle } from "../dom.js";

export const ITEMS = "/api/v2/marketplace/items";
export const itemPath = (id) => `${ITEMS}/${encodeURIComponent(id)}`;

export function starButton(item, onchange) {
  const label = () => `${item.starred ? "Unstar" : "Star"} ${item.name} (${item.stars} ${item.stars === 1 ? "star" : "stars"})`;
  const button = h("button", { type: "button", class: "ghost star", "aria-pressed": String(!!item.starred), "aria-label": label(), title: label() },
    `${item.starred ? "★" : "☆"} ${item.stars}`);
  button.addEventListener("click", async () => {
    try {
      const got = await api(item.starred ? "DELETE" : "PUT", `${itemPath(item.id)}/star`);
      Object.assign(item, { starred: got.starred, stars: got.stars });
      button.textContent = `${item.starred ? "★" : "☆"} ${item.stars}`;
      button.setAttribute("aria-pressed", String(item.starred));
      button.setAttribute("aria-label", label()); button.title = label();
      announce(item.starred ? `Starred ${item.name}` : `Unstarred ${item.name}`);
      if (onchange) onchange(item);
    } catch (err) { announce(err.message); alert(err.message); }
  });
  return button;
}

export function visibilityBadge(item) {
  if (item.visibility === "public") {
    const cls = item.approval === "approved" ? "ok" : item.approval === "rejected" ? "bad" : "pending";
    return h("span", { class: `badge vis-${cls}`, "data-approval": item.approval }, item.approval === "approved" ? "public" : `public · ${item.approval}`);
  }
  return h("span", { class: "badge", "data-visibility": item.visibility },
    item.visibility === "groups" ? `shared: ${item.groups.join(", ")}` : "private");
}

function card(item) {
  return h("article", { class: "card market-card", dataset: { item: item.id } },
    h("header", { class: "market-card-head" },
      h("h2", {}, h("a", { href: `#/market/item/${encodeURIComponent(item.id)}` }, item.name)),
      starButton(item)),
    h("p", { class: "muted" }, `${item.kind === "data" ? "Data" : "Template"} · ${item.category} · by ${item.owner}`,
      item.builtin ? " · built in" : "", ` · ${item.submits} ${item.submits === 1 ? "job" : "jobs"}`),
    item.summary ? h("p", {}, item.summary) : null,
    h("p", { class: "market-tags" }, visibilityBadge(item), item.tags.map((t) => h("span", { class: "tag" }, t))));
}

export async function render(main, { params, go }) {
  const state = {
    q: params.get("q") || "", tag: params.get("tag") || "", category: params.get("category") || "",
    kind: params.get("kind") || "", mine: params.get("mine") === "true", starred: params.get("starred") === "true",
    sort: params.get("sort") || "stars",
  };
  const results = h("div", { id: "market-results", "aria-live": "polite" });
  const search = h("input", { id: "market-q", type: "search", value: state.q, placeholder: "words in a name, summary or tag" });
  const tagSelect = h("select", { id: "market-tag" });
  const categorySelect = h("select", { id: "market-category" });
  const kindSelect = h("select", { id: "market-kind" }, [["", "any"], ["template", "templates"], ["data", "data"]].map(([v, t]) => h("option", { value: v, selected: v === state.kind }, t)));
  const sortSelect = h("select", { id: "market-sort" }, [["stars", "most starred"], ["submits", "most used"], ["recent", "recent"], ["name", "name"]].map(([v, t]) => h("option", { value: v, selected: v === state.sort }, t)));
  const mine = h("input", { id: "market-mine", type: "checkbox", checked: state.mine });
  const starred = h("input", { id: "market-starred", type: "checkbox", checked: state.starred });

  function options(select, counts, chosen) {
    const names = Object.keys(counts);
    if (chosen && !names.includes(chosen)) names.push(chosen);
    clear(select, h("option", { value: "" }, "any"), names.map((n) => h("option", { value: n, selected: n === chosen }, counts[n] ? `${n} (${counts[n]})` : n)));
  }

  function query() {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(state)) if (v && v !== "stars") q.set(k, v === true ? "true" : v);
    return q;
  }

  async function load() {
    const q = query();
    if (q.get("sort") === null) q.set("sort", state.sort);
    try {
      const got = await get(`${ITEMS}?${q}`);
      options(tagSelect, got.tags, state.tag);
      options(categorySelect, got.categories, state.category);
      clear(results, h("p", { class: "muted", id: "market-count" }, `${got.total} ${got.total === 1 ? "item" : "items"}`),
        got.items.length ? h("div", { class: "cards" }, got.items.map(card)) : h("p", {}, "Nothing matches. ", h("a", { href: "#/market/new" }, "Publish one")));
    } catch (err) { clear(results, errorBox(err)); }
  }

  function changed() {
    Object.assign(state, { q: search.value.trim(), tag: tagSelect.value, category: categorySelect.value, kind: kindSelect.value,
      sort: sortSelect.value, mine: mine.checked, starred: starred.checked });
    history.replaceState(null, "", `#/market${query().toString() ? `?${query()}` : ""}`);
    load();
  }
  let timer = null;
  search.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(changed, 250); });
  for (const el of [tagSelect, categorySelect, kindSelect, sortSelect, mine, starred]) el.addEventListener("change", changed);

  const field = (id, text, el) => h("div", { class: "field" }, h("label", { for: id }, text), el);
  clear(main, pageTitle("Marketplace"),
    h("p", { class: "muted" }, "Job templates and data to reuse. Open one to read it and ", h("em", {}, "Use"), " it: the submit page opens with it filled in."),
    h("div", { class: "toolbar" },
      h("a", { class: "button primary", href: "#/market/new", id: "market-new" }, "Publish an item"),
      session.me && session.me.admin ? h("a", { class: "button", href: "#/market/review", id: "market-review-link" }, "Review queue") : null),
    h("form", { class: "filters", role: "search", "aria-label": "Search the marketplace", onsubmit: (e) => { e.preventDefault(); changed(); } },
      field("market-q", "Search", search), field("market-tag", "Tag", tagSelect), field("market-category", "Category", categorySelect),
      field("market-kind", "Kind", kindSelect), field("market-sort", "Order", sortSelect),
      h("div", { class: "field" }, h("span", { class: "label-spacer" }, "Show"),
        h("label", {}, mine, " mine"), h("label", {}, starred, " starred"))),
    results);
  await load();
  return () => clearTimeout(timer);
}
