// The job list: filters, sort, paging from the server's index; live state from the
// event stream; bulk stop. The filters live in the URL, so a view can be shared.

import { api, events, get, jobPath, session } from "../api.js";
import { FINAL_STATES, announce, clear, fmtDuration, fmtTime, h, pageTitle, stateBadge } from "../dom.js";

const PAGE_SIZE = 50;
const STATES = ["WAITING", "RUNNING", "STOPPING", "SUCCEEDED", "FAILED", "STOPPED"];
const COLUMNS = [
  ["name", "Name"], ["username", "User"], ["virtualCluster", "VC"], ["state", "State"],
  ["totalGpuNumber", "GPUs"], ["totalTaskNumber", "Tasks"], ["retries", "Retries"], ["createdTime", "Submitted"],
];

function mayStop(row) {
  return !FINAL_STATES.has(row.state) && row.executionType !== "STOP" && (session.me.admin || row.username === session.me.username);
}

export async function render(main, { params, go }) {
  const q = {
    username: params.get("username") || "", vc: params.get("vc") || "", state: params.get("state") || "",
    tags: params.get("tags") || "", keyword: params.get("keyword") || "",
    order: params.get("order") || "createdTime,DESC", offset: Number(params.get("offset") || 0),
  };
  const selected = new Set();
  let rows = [];

  const field = (id, label, input) => h("div", { class: "field" }, h("label", { for: id }, label), input);
  const user = h("input", { id: "f-user", value: q.username, placeholder: "any", list: "f-user-me" });
  const vc = h("input", { id: "f-vc", value: q.vc, placeholder: "any" });
  const state = h("select", { id: "f-state" }, h("option", { value: "" }, "any"),
    STATES.map((s) => h("option", { value: s, selected: s === q.state }, s)));
  const tags = h("input", { id: "f-tags", value: q.tags, placeholder: "tag1,tag2" });
  const keyword = h("input", { id: "f-keyword", value: q.keyword, placeholder: "part of the name", type: "search" });
  const filters = h("form", { class: "filters", role: "search", "aria-label": "Filter jobs", onsubmit: (e) => {
    e.preventDefault();
    navigate({ username: user.value.trim(), vc: vc.value.trim(), state: state.value, tags: tags.value.trim(), keyword: keyword.value.trim(), offset: 0 });
  } },
  field("f-user", "User", user), h("datalist", { id: "f-user-me" }, h("option", { value: session.me.username })),
  field("f-vc", "Virtual cluster", vc), field("f-state", "State", state), field("f-tags", "Tags", tags),
  field("f-keyword", "Keyword", keyword),
  h("div", { class: "field" }, h("span", { class: "label-spacer" }, " "), h("button", { type: "submit", class: "primary" }, "Apply")),
  h("div", { class: "field" }, h("span", { class: "label-spacer" }, " "), h("button", { type: "button", onclick: () => navigate({ username: session.me.username, vc: "", state: "", tags: "", keyword: "", offset: 0 }) }, "My jobs")));

  function navigate(change) {
    const next = { ...q, ...change };
    const sp = new URLSearchParams();
    for (const [k, v] of Object.entries(next)) if (v !== "" && !(k === "offset" && !v) && !(k === "order" && v === "createdTime,DESC")) sp.set(k, v);
    const s = sp.toString();
    go(`/jobs${s ? "?" + s : ""}`);
  }

  const status = h("p", { class: "muted", id: "jobs-status", "aria-live": "polite" });
  const stopButton = h("button", { type: "button", class: "danger", disabled: true, onclick: bulkStop }, "Stop selected");
  const tbody = h("tbody");
  const allBox = h("input", { type: "checkbox", "aria-label": "Select every stoppable job on this page", onchange: () => {
    for (const r of rows) if (mayStop(r)) { if (allBox.checked) selected.add(r.debugId); else selected.delete(r.debugId); }
    draw();
  } });
  const [orderField, orderDir] = q.order.split(",");
  const head = h("tr", {}, h("th", { scope: "col" }, allBox), COLUMNS.map(([key, label]) => {
    const active = orderField === key;
    const dir = active ? orderDir : null;
    return h("th", { scope: "col", "aria-sort": active ? (dir === "ASC" ? "ascending" : "descending") : "none" },
      h("button", { type: "button", class: "sort", onclick: () => navigate({ order: `${key},${active && dir === "DESC" ? "ASC" : "DESC"}`, offset: 0 }) },
        label, active ? (dir === "ASC" ? " ▲" : " ▼") : ""));
  }), h("th", { scope: "col" }, "Waiting because"));
  const pager = h("nav", { class: "pager", "aria-label": "Pages" });

  clear(main, pageTitle("Jobs"), filters,
    h("div", { class: "toolbar" }, stopButton, h("a", { class: "button", href: "#/submit" }, "Submit a job"), status),
    h("div", { class: "table-wrap" }, h("table", { class: "jobs", "aria-describedby": "jobs-status" }, h("thead", {}, head), tbody)),
    pager);

  function draw() {
    clear(tbody, rows.map((r) => h("tr", { dataset: { job: r.debugId } },
      h("td", {}, mayStop(r) ? h("input", { type: "checkbox", checked: selected.has(r.debugId), "aria-label": `select ${r.debugId}`,
        onchange: (e) => { if (e.target.checked) selected.add(r.debugId); else selected.delete(r.debugId); updateStop(); } }) : ""),
      h("td", {}, h("a", { href: `#/jobs/${encodeURIComponent(r.debugId)}` }, r.name),
        (r.tags || []).map((t) => h("span", { class: "tag" }, t))),
      h("td", {}, r.username), h("td", {}, r.virtualCluster),
      h("td", { class: "state-cell" }, stateBadge(r.state)),
      h("td", { class: "num" }, String(r.totalGpuNumber)), h("td", { class: "num" }, String(r.totalTaskNumber)),
      h("td", { class: "num" }, String(r.retries)),
      h("td", { title: fmtTime(r.createdTime) }, `${fmtDuration(r.createdTime)} ago`),
      h("td", { class: "reason" }, r.waitingReason || ""))));
    if (!rows.length) tbody.append(h("tr", {}, h("td", { colspan: String(COLUMNS.length + 2), class: "muted" }, "No job matches.")));
    updateStop();
  }

  function updateStop() {
    const n = [...selected].length;
    stopButton.disabled = n === 0;
    stopButton.textContent = n ? `Stop selected (${n})` : "Stop selected";
  }

  async function load() {
    const sp = new URLSearchParams({ offset: String(q.offset), limit: String(PAGE_SIZE), withTotalCount: "true", order: q.order });
    for (const k of ["username", "vc", "state", "tags", "keyword"]) if (q[k]) sp.set(k, q[k]);
    const page = await get(`/api/v2/jobs?${sp}`);
    rows = page.data;
    for (const id of [...selected]) if (!rows.some((r) => r.debugId === id && mayStop(r))) selected.delete(id);
    draw();
    const first = page.totalCount ? q.offset + 1 : 0;
    const last = q.offset + rows.length;
    // A keyword's total may be a lower bound (totalCountCapped): "at least", and a full page has a next one.
    const more = page.totalCountCapped ? "+" : "";
    const total = Math.max(page.totalCount, last);
    status.textContent = `${first}–${last} of ${total.toLocaleString()}${more} jobs`;
    clear(pager,
      h("button", { type: "button", disabled: q.offset === 0, onclick: () => navigate({ offset: Math.max(0, q.offset - PAGE_SIZE) }) }, "‹ Previous"),
      h("span", {}, `Page ${Math.floor(q.offset / PAGE_SIZE) + 1} of ${Math.max(1, Math.ceil(total / PAGE_SIZE))}${more}`),
      h("button", { type: "button", disabled: page.totalCountCapped ? rows.length < PAGE_SIZE : last >= total, onclick: () => navigate({ offset: q.offset + PAGE_SIZE }) }, "Next ›"));
  }

  async function bulkStop() {
    const ids = [...selected];
    if (!ids.length || !confirm(`Stop ${ids.length} job(s)?\n${ids.slice(0, 10).join("\n")}${ids.length > 10 ? "\n…" : ""}`)) return;
    stopButton.disabled = true;
    const results = await Promise.allSettled(ids.map((id) => api("PUT", `${jobPath(id)}/executionType`, { body: { value: "STOP" } })));
    const failed = results.map((r, i) => [r, ids[i]]).filter(([r]) => r.status === "rejected");
    selected.clear();
    announce(failed.length ? `${ids.length - failed.length} stop(s) requested; ${failed.length} refused: ${failed[0][0].reason.message}`
      : `stop of ${ids.length} job(s) requested`);
    status.textContent = failed.length ? `Refused: ${failed.map(([r, id]) => `${id}: ${r.reason.message}`).join("; ")}` : `Stop of ${ids.length} job(s) requested.`;
    await load();
  }

  await load();
  // Live: a state change patches its row at once; the page is then re-read (debounced)
  // for what a patch cannot know: new jobs, jobs leaving a state filter, the counts.
  let pending = null;
  const off = events.subscribe((ev) => {
    const row = rows.find((r) => r.debugId === ev.job);
    if (row) {
      row.state = ev.state;
      const cell = tbody.querySelector(`tr[data-job="${CSS.escape(ev.job)}"] .state-cell`);
      if (cell) clear(cell, stateBadge(ev.state));
    }
    if (!pending) pending = setTimeout(() => { pending = null; load().catch(() => {}); }, 1000);
  });
  const timer = setInterval(() => load().catch(() => {}), 20000); // others' jobs (not on a user's stream)
  return () => { off(); clearTimeout(pending); clearInterval(timer); };
}
