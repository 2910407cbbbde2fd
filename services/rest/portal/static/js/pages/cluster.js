// Cluster: nodes × GPUs as a heat map of utilisation (the monitor's latest samples),
// node health and cordon state; admins cordon and uncordon.

import { api, get, session } from "../api.js";
import { announce, clear, errorBox, fmtBytes, h, pageTitle, table } from "../dom.js";

function heat(pct) {
  if (pct === null || pct === undefined) return "heat-none";
  return `heat-${Math.min(10, Math.max(0, Math.round(pct / 10)))}`;
}

export async function render(main) {
  const body = h("div");
  clear(main, pageTitle("Cluster"), body);
  async function load() {
    const [nodes, util] = await Promise.all([get("/api/v2/cluster/nodes"), get("/api/v2/portal/utilization")]);
    const samples = Object.fromEntries(util.nodes.map((n) => [n.node, n]));
    const names = [...new Set([...nodes.map((n) => n.name), ...util.nodes.map((n) => n.node)])].sort();
    const maxGpus = Math.max(1, ...util.nodes.map((n) => n.gpus.length));
    const anyGpu = util.nodes.some((n) => n.gpus.length);
    const gridRows = names.map((name) => {
      const s = samples[name];
      const cells = [];
      if (anyGpu) {
        for (let i = 0; i < maxGpus; i++) {
          const g = s && s.gpus[i];
          const pct = g ? g.utilizationGpuPercent : null;
          cells.push(h("td", { class: `heat ${g ? heat(pct) : "heat-absent"}`, title: g ? `${g.name} GPU ${g.index}: ${pct ?? "?"}% busy, memory ${fmtBytes(g.memoryUsedBytes)} of ${fmtBytes(g.memoryTotalBytes)}` : "no GPU" },
            g ? (pct === null || pct === undefined ? "?" : `${Math.round(pct)}%`) : ""));
        }
      }
      const cpu = s ? s.cpuPercent : null;
      cells.push(h("td", { class: `heat ${heat(cpu)}`, title: s ? `CPU ${cpu}% of ${s.cpuCount}` : "no sample yet" }, s ? `${Math.round(cpu)}%` : "–"));
      const mem = s && s.memoryTotalBytes ? (100 * s.memoryUsedBytes) / s.memoryTotalBytes : null;
      cells.push(h("td", { class: `heat ${heat(mem)}`, title: s ? `memory ${fmtBytes(s.memoryUsedBytes)} of ${fmtBytes(s.memoryTotalBytes)}` : "" }, mem === null ? "–" : `${Math.round(mem)}%`));
      return h("tr", {}, h("th", { scope: "row" }, name), cells);
    });
    const gpuHeads = anyGpu ? Array.from({ length: maxGpus }, (_, i) => `GPU ${i}`) : [];
    const note = util.nodes.find((n) => n.gpuNote);
    const healthRows = nodes.map((n) => {
      const reason = h("input", { "aria-label": `reason to cordon ${n.name}`, placeholder: "reason", size: "14" });
      const action = !session.me.admin ? "" : n.cordoned
        ? h("button", { type: "button", class: "small", onclick: () => change("DELETE", n.name, {}) }, "Uncordon")
        : h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); change("PUT", n.name, { reason: reason.value.trim() }); } }, reason, h("button", { type: "submit", class: "small" }, "Cordon"));
      return h("tr", {}, h("th", { scope: "row" }, n.name),
        h("td", {}, h("span", { class: `badge ${n.healthy ? "ok" : "bad"}` }, n.healthy ? "healthy" : "unhealthy")),
        h("td", {}, (n.conditions || []).join(", ") || "–"), h("td", {}, n.reason || ""),
        h("td", {}, n.cordoned ? `cordoned: ${n.cordonReason} (${n.cordonedBy})` : "schedulable"), h("td", {}, action));
    });
    clear(body,
      h("section", { "aria-labelledby": "heat-title" }, h("h2", { id: "heat-title" }, "Utilisation"),
        h("p", { class: "muted" }, anyGpu ? "Each cell is one GPU's utilisation at the monitor's latest sample; CPU and memory of the node after them." : `No GPU reported${note ? ` (${note.gpuNote})` : ""}: CPU and memory per node.`),
        h("div", { class: "table-wrap" }, table(["node", ...gpuHeads, "CPU", "memory"], gridRows, { class: "heatmap", id: "heatmap" })),
        h("p", { class: "legend", "aria-hidden": "true" }, "0% ", Array.from({ length: 11 }, (_, i) => h("span", { class: `heat heat-${i}` }, " ")), " 100%")),
      h("section", { "aria-labelledby": "health-title" }, h("h2", { id: "health-title" }, "Node health"),
        h("div", { class: "table-wrap" }, table(["node", "health", "conditions", "reason", "cordon", ""], healthRows, { id: "nodes" }))));
  }
  async function change(method, node, bodyObj) {
    try {
      await api(method, `/api/v2/cluster/nodes/${encodeURIComponent(node)}/cordon`, { body: bodyObj });
      announce(`${method === "PUT" ? "cordon" : "uncordon"} of ${node} requested`);
      setTimeout(() => load().catch(() => {}), 800);
    } catch (err) { body.prepend(errorBox(err)); }
  }
  await load();
  const timer = setInterval(() => load().catch(() => {}), 5000);
  return () => clearInterval(timer);
}
