// A job's utilisation over time (GET /api/v2/jobs/{id}/metrics): one chart for the
// whole job and one per task, CPU and GPU in % on the left axis, memory in GiB on the
// right; a banner when the job holds GPUs idle; the job's Grafana dashboard where
// configured. Drawn with uPlot, vendored under /portal/vendor/uplot (MIT).

import uPlot from "../../vendor/uplot/uPlot.esm.js";
import { get, jobPath } from "../api.js";
import { FINAL_STATES, clear, h } from "../dom.js";

const GIB = 1024 ** 3;
const MIN_REFRESH_MS = 2000;
const COLOURS = { cpu: "#1d4ed8", gpu: "#1a7f37", gpuMem: "#9a6700", mem: "#7c3aed" };

function chartData(series) {
  const data = [series.t, series.cpuPercent];
  const lines = [{ label: "CPU %", stroke: COLOURS.cpu, scale: "%" }];
  if (series.gpuPercent) { data.push(series.gpuPercent); lines.push({ label: "GPU %", stroke: COLOURS.gpu, scale: "%" }); }
  if (series.gpuMemoryPercent) { data.push(series.gpuMemoryPercent); lines.push({ label: "GPU mem %", stroke: COLOURS.gpuMem, scale: "%" }); }
  data.push(series.memoryBytes.map((b) => b / GIB));
  lines.push({ label: "memory GiB", stroke: COLOURS.mem, scale: "GiB", value: (u, v) => (v == null ? "–" : v.toFixed(2)) });
  return { data, lines };
}

function makeChart(box, title, series) {
  const { data, lines } = chartData(series);
  const width = Math.max(280, Math.min(box.clientWidth || 640, 900));
  return new uPlot({
    title, width, height: 180,
    series: [{}, ...lines.map((l) => ({ ...l, width: 1.5, spanGaps: false }))],
    scales: { "%": { range: (u, lo, hi) => [0, Math.max(100, hi)] }, GiB: { range: (u, lo, hi) => [0, Math.max(0.1, hi * 1.1)] } },
    axes: [{}, { scale: "%", label: "%" }, { scale: "GiB", side: 1, label: "GiB", grid: { show: false } }],
  }, data, box);
}

// One chart that keeps its uPlot between refreshes (setData), made again only when
// the series it draws change (a GPU series appearing).
function chartSlot(id, title) {
  const box = h("div", { class: "chart", id, "data-points": "0", role: "img", "aria-label": title });
  let plot = null;
  let shape = "";
  return {
    box,
    update(series) {
      const { data, lines } = chartData(series);
      const key = lines.map((l) => l.label).join(",");
      box.dataset.points = String(series.t.length);
      if (plot && key === shape) { plot.setData(data); return; }
      if (plot) plot.destroy();
      shape = key;
      plot = makeChart(box, title, series);
    },
    destroy() { if (plot) plot.destroy(); },
  };
}

export function metricsSection(id) {
  const status = h("p", { class: "muted", id: "metrics-status" }, "Loading utilisation…");
  const idle = h("p", { class: "note warn", id: "gpu-idle", hidden: true });
  const links = h("p", { id: "metrics-links" });
  const charts = h("div", { class: "charts" });
  const section = h("section", { id: "utilisation", "aria-labelledby": "utilisation-title" },
    h("h2", { id: "utilisation-title" }, "Utilisation"), status, idle, links, charts);
  const slots = new Map();
  let timer = null;
  let stopped = false;

  function slot(key, title) {
    if (!slots.has(key)) {
      const s = chartSlot(`chart-${key.replace(/[^a-zA-Z0-9_-]/g, "_")}`, title);
      slots.set(key, s);
      charts.append(s.box);
    }
    return slots.get(key);
  }

  async function refresh() {
    let m;
    try { m = await get(`${jobPath(id)}/metrics`); } catch (err) { status.textContent = err.message; return null; }
    const n = m.total.series.t.length;
    status.textContent = n
      ? `${m.tasks.length} task(s), a point every ${m.step}s${m.total.series.gpuPercent ? "" : " · no GPU readings on its nodes"}`
      : (m.state === "RUNNING" ? "No samples yet: the node agent samples every " + m.sampleSeconds + "s." : "No samples of this job.");
    idle.hidden = !m.gpuIdle.idle;
    idle.textContent = m.gpuIdle.idle ? `⚠ Idle GPUs: this job ${m.gpuIdle.reason}.` : "";
    clear(links, m.grafanaUrl ? h("a", { href: m.grafanaUrl, target: "_blank", rel: "noopener", id: "grafana-link" }, "Open in Grafana") : null);
    if (n) {
      slot("job", "Whole job").update(m.total.series);
      for (const t of m.tasks) slot(`${t.taskRoleName}-${t.taskIndex}`, `${t.taskRoleName}[${t.taskIndex}] on ${t.node || "?"}`).update(t.series);
    }
    return m;
  }

  async function loop() {
    const m = await refresh();
    if (stopped || (m && FINAL_STATES.has(m.state))) return;
    const every = Math.max(MIN_REFRESH_MS, ((m && m.sampleSeconds) || 5) * 1000);
    timer = setTimeout(loop, every);
  }

  return {
    section,
    start() { loop(); },
    stop() { stopped = true; clearTimeout(timer); for (const s of slots.values()) s.destroy(); },
  };
}
