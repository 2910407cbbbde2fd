// Virtual clusters: cells per sku (guaranteed / used / opportunistic) and each VC's queue.

import { events, get } from "../api.js";
import { clear, fmtDuration, h, pageTitle, stateBadge, table } from "../dom.js";

function skuTable(vc) {
  return table(["sku", "guaranteed", "used", "opportunistic", "cluster total", "unhealthy"], vc.skus.map((s) => h("tr", {},
    h("th", { scope: "row" }, s.sku), h("td", { class: "num" }, String(s.guaranteed)), h("td", { class: "num" }, String(s.used)),
    h("td", { class: "num" }, String(s.opportunistic)), h("td", { class: "num" }, String(s.total)), h("td", { class: "num" }, String(s.unhealthy)))),
  { class: "compact" });
}

export async function render(main, { args }) {
  const chosen = args[0] || null;
  const body = h("div");
  clear(main, pageTitle(chosen ? `Virtual cluster ${chosen}` : "Virtual clusters"), body);
  async function load() {
    const all = await get("/api/v2/virtual-clusters");
    const names = Object.keys(all);
    if (!chosen) {
      clear(body, h("p", { class: "muted" }, "Cells are leaf cells of a sku (one GPU, or one CPU share on a CPU sku). Used: held by the VC's guaranteed jobs; opportunistic: by its low-priority jobs anywhere."),
        h("div", { class: "cards" }, names.map((n) => {
          const vc = all[n];
          return h("section", { class: "card", "aria-labelledby": `vc-${n}` },
            h("h2", { id: `vc-${n}` }, h("a", { href: `#/vcs/${encodeURIComponent(n)}` }, n)),
            h("p", { class: "muted" }, `${vc.running} running · ${vc.queued} waiting · ${vc.capacity}% of the cluster guaranteed, ${vc.usedCapacity}% in use`),
            skuTable(vc));
        })));
      return;
    }
    const vc = all[chosen];
    if (!vc) { clear(body, h("p", {}, `No virtual cluster ${chosen}. Known: ${names.join(", ")}`)); return; }
    const q = await get(`/api/v2/portal/queue/${encodeURIComponent(chosen)}`);
    const rows = q.jobs.map((j, i) => h("tr", {},
      h("td", { class: "num" }, String(i + 1)),
      h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(j.debugId)}` }, j.debugId)),
      h("td", {}, stateBadge(j.state)), h("td", { class: "num" }, String(j.priority)),
      h("td", { class: "num" }, String(j.totalTaskNumber)), h("td", {}, `${fmtDuration(j.createdTime)}`),
      h("td", { class: "reason" }, j.waitingReason || "")));
    clear(body,
      h("p", { class: "muted" }, `${vc.running} running · ${q.count} waiting`), skuTable(vc),
      h("h2", {}, `Queue (${q.count})`),
      q.count ? h("div", { class: "table-wrap" }, table(["#", "job", "state", "priority", "tasks", "waiting for", "why"], rows, { id: "queue" }))
        : h("p", { class: "muted" }, "Nothing waits in this virtual cluster."),
      h("p", {}, h("a", { href: "#/vcs" }, "All virtual clusters")));
  }
  await load();
  let pending = null;
  const off = events.subscribe(() => { if (!pending) pending = setTimeout(() => { pending = null; load().catch(() => {}); }, 1500); });
  const timer = setInterval(() => load().catch(() => {}), 10000);
  return () => { off(); clearTimeout(pending); clearInterval(timer); };
}
