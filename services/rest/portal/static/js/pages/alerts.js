// Alerts: firing first, then recently resolved (admins see all, a user those about their jobs).

import { get } from "../api.js";
import { clear, fmtTime, h, pageTitle, table } from "../dom.js";

function rows(list) {
  return list.map((a) => h("tr", { class: `sev-${a.severity}` },
    h("td", {}, h("span", { class: `badge sev-${a.severity}` }, a.severity)), h("th", { scope: "row" }, a.rule),
    h("td", {}, a.summary, a.solution && a.solution.length ? h("div", { class: "muted" }, a.solution.join(" ")) : ""),
    h("td", {}, a.job ? h("a", { href: `#/jobs/${encodeURIComponent(a.job)}` }, a.job) : a.node || a.service || a.vc || ""),
    h("td", {}, fmtTime(a.startsAt * 1000)), h("td", {}, a.endsAt ? fmtTime(a.endsAt * 1000) : "–")));
}

export async function render(main) {
  const body = h("div");
  clear(main, pageTitle("Alerts"), body);
  async function load() {
    const { alerts } = await get("/api/v2/alerts");
    const firing = alerts.filter((a) => a.state === "firing");
    const resolved = alerts.filter((a) => a.state !== "firing");
    const heads = ["severity", "rule", "what", "about", "since", "resolved"];
    clear(body,
      h("h2", {}, `Firing (${firing.length})`),
      firing.length ? h("div", { class: "table-wrap" }, table(heads, rows(firing), { id: "firing" })) : h("p", { class: "muted" }, "No alert is firing."),
      h("h2", {}, `Recent (${resolved.length})`),
      resolved.length ? h("div", { class: "table-wrap" }, table(heads, rows(resolved), { id: "resolved" })) : h("p", { class: "muted" }, "No alert resolved recently."));
  }
  await load();
  const timer = setInterval(() => load().catch(() => {}), 10000);
  return () => clearInterval(timer);
}
