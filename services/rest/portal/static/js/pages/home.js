// Home: the cluster at a glance. One summary call (GET /api/v2/portal/overview).

import { events, get, session } from "../api.js";
import { clear, fmtTime, h, pageTitle, stateBadge, table } from "../dom.js";

function meter(used, total, label) {
  const pct = total ? Math.min(100, Math.round((100 * used) / total)) : 0;
  const fill = h("div", { class: "meter-fill" });
  fill.style.width = `${pct}%`; // through the CSSOM: the page's CSP allows no inline style attributes
  return h("div", { class: "meter", role: "meter", "aria-valuemin": "0", "aria-valuemax": String(total || 0),
    "aria-valuenow": String(used), "aria-label": label }, fill);
}

function vcCard(vc) {
  const rows = vc.skus.map((s) => {
    const unit = s.gpusPerCell ? "GPUs" : "cells";
    const used = s.gpusPerCell ? s.gpusUsed : s.used + s.opportunistic;
    const free = s.gpusPerCell ? s.gpusFree : s.free;
    const quota = s.gpusPerCell ? s.guaranteed * s.gpusPerCell : s.guaranteed;
    return h("tr", {},
      h("th", { scope: "row" }, s.sku),
      h("td", { class: "num" }, `${used} ${unit}`),
      h("td", { class: "num" }, `${free} ${unit}`),
      h("td", {}, meter(used, Math.max(quota, used), `${vc.name} ${s.sku}: ${used} of ${quota} ${unit} used`)));
  });
  return h("section", { class: "card", "aria-labelledby": `vc-${vc.name}` },
    h("h3", { id: `vc-${vc.name}` }, h("a", { href: `#/vcs/${encodeURIComponent(vc.name)}` }, vc.name)),
    h("p", { class: "muted" }, `${vc.running} running · ${vc.queued} waiting`),
    table(["sku", "used", "free", "of quota"], rows, { class: "compact" }));
}

export async function render(main) {
  const body = h("div", { class: "home" });
  clear(main, pageTitle("Cluster at a glance"), body);
  async function load() {
    const o = await get("/api/v2/portal/overview");
    const states = Object.entries(o.jobsByState).map(([state, n]) =>
      h("a", { class: "stat", href: `#/jobs?state=${state}` }, h("span", { class: "stat-n" }, String(n)), stateBadge(state)));
    const mine = o.myRecentJobs.length
      ? table(["job", "state", "VC", "submitted"], o.myRecentJobs.map((j) => h("tr", {},
        h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(j.debugId)}` }, j.name)),
        h("td", {}, stateBadge(j.state)), h("td", {}, j.virtualCluster), h("td", {}, fmtTime(j.createdTime)))))
      : h("p", { class: "muted" }, "You have not submitted a job yet. ", h("a", { href: "#/submit" }, "Submit one"), ".");
    const alerts = o.firingAlerts.length
      ? h("ul", { class: "alerts" }, o.firingAlerts.map((a) => h("li", { class: `sev-${a.severity}` },
        h("strong", {}, a.rule), " ", a.summary)))
      : h("p", { class: "muted" }, "No alert is firing.");
    clear(body,
      h("section", { "aria-labelledby": "h-states" }, h("h2", { id: "h-states" }, `Jobs (${o.totalJobs})`),
        h("div", { class: "stats" }, states)),
      h("section", { "aria-labelledby": "h-vcs" }, h("h2", { id: "h-vcs" }, "Virtual clusters"),
        h("div", { class: "cards" }, o.virtualClusters.map(vcCard))),
      h("div", { class: "two" },
        h("section", { "aria-labelledby": "h-mine" }, h("h2", { id: "h-mine" }, `My recent jobs (${session.me.username})`), mine),
        h("section", { "aria-labelledby": "h-alerts" }, h("h2", { id: "h-alerts" }, h("a", { href: "#/alerts" }, `Firing alerts (${o.firingCount})`)), alerts)));
  }
  await load();
  let pending = null;
  const off = events.subscribe(() => { if (!pending) pending = setTimeout(() => { pending = null; load().catch(() => {}); }, 1500); });
  const timer = setInterval(() => load().catch(() => {}), 15000);
  return () => { off(); clearInterval(timer); clearTimeout(pending); };
}
