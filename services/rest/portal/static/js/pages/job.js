// One job: state, why it waits or why it failed, attempts, tasks, live log tail,
// config (secrets masked by the API), stop, clone, tags. Live through the event stream.

import { api, download, events, get, jobPath, session } from "../api.js";
import { FINAL_STATES, announce, clear, errorBox, fmtDuration, fmtTime, h, pageTitle, stateBadge, table } from "../dom.js";
import { metricsSection } from "./job_metrics.js";
import { sshSection } from "./job_ssh.js";
import { runsTensorBoard, tensorBoardButton } from "./job_tensorboard.js";
import { marketLink } from "./market_submit.js";
import { terminalSection } from "./job_terminal.js";
import { exportYaml, saveAsTemplate } from "../jobfile.js";

const LOG_TAIL_BYTES = 64 * 1024;
const LOG_POLL_MS = 2000;

function exitSpecBox(spec, code, diagnostics, title) {
  if (!spec && (code === null || code === undefined)) return null;
  const solution = spec && spec.solution ? spec.solution : [];
  return h("section", { class: "card failure", id: "failure", "aria-labelledby": "failure-title" },
    h("h2", { id: "failure-title" }, title),
    h("p", {}, h("strong", {}, `Exit code ${spec ? spec.code : code}`), spec && spec.phrase ? ` — ${spec.phrase}` : "",
      spec && spec.type ? h("span", { class: "muted" }, ` (${spec.type})`) : ""),
    spec && spec.reason ? h("p", { class: "reason-text" }, h("strong", {}, "Reason: "), spec.reason) : null,
    solution.length ? h("div", { class: "solution" }, h("strong", {}, "What to do:"), h("ul", {}, solution.map((s) => h("li", {}, s)))) : null,
    diagnostics ? h("details", {}, h("summary", {}, "Diagnostics"), h("pre", { class: "log small" }, diagnostics)) : null);
}

// Export as YAML and Save as template, from the config as submitted (secrets masked).
function jobFileButtons(id, name, out) {
  const config = () => api("GET", `${jobPath(id)}/config`, { accept: "text/yaml" });
  const failed = (err) => out.append(errorBox(err));
  return [
    h("button", { type: "button", id: "job-export", onclick: () => config().then((text) => exportYaml(text, name), failed) }, "Export as YAML"),
    h("button", { type: "button", id: "job-save-template", onclick: () => config().then((text) => saveAsTemplate(text, name, out), failed) }, "Save as template"),
  ];
}

export async function render(main, { args, go }) {
  const id = args[0];
  const mine = () => session.me.admin || id.split("~")[0] === session.me.username;
  const owned = () => id.split("~")[0] === session.me.username;  // the job's key is its owner's alone
  const head = h("div");
  const body = h("div", { class: "job-body" });
  const logBox = h("pre", { class: "log", id: "log", tabindex: "0", "aria-label": "task log (tail)" }, "");
  const logSelect = h("select", { id: "log-task" });
  const logState = h("span", { class: "muted" });
  let detail = null;
  let logTimer = null;
  let stopped = false;
  const metrics = metricsSection(id);  // kept across reloads: its charts fill as samples come
  let metricsStarted = false;
  const ssh = sshSection(id);  // the owner's command lines, where the job runs an SSH server
  const terminal = terminalSection(id);  // kept across reloads: a session stays open while the page refreshes

  async function loadLog() {
    if (!logSelect.value) return;
    const [role, index] = logSelect.value.split("/");
    try {
      const text = await get(`${jobPath(id)}/logs?taskRole=${encodeURIComponent(role)}&taskIndex=${index}&tailBytes=${LOG_TAIL_BYTES}`);
      const atBottom = logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 20;
      const shown = text || (FINAL_STATES.has(detail.jobStatus.state) ? "(the task printed nothing)" : "(nothing printed yet)");
      if (logBox.textContent !== shown) { logBox.textContent = shown; if (atBottom) logBox.scrollTop = logBox.scrollHeight; }
      logState.textContent = FINAL_STATES.has(detail.jobStatus.state) ? "complete" : "following…";
    } catch (err) {
      logBox.textContent = err.status === 404 ? "(the task has not started yet)" : err.message;
    }
  }
  function scheduleLog() {
    clearTimeout(logTimer);
    if (stopped) return;
    logTimer = setTimeout(async () => { await loadLog(); if (!FINAL_STATES.has(detail.jobStatus.state)) scheduleLog(); }, LOG_POLL_MS);
  }

  async function stop() {
    if (!confirm(`Stop ${id}?`)) return;
    try {
      await api("PUT", `${jobPath(id)}/executionType`, { body: { value: "STOP" } });
      announce(`Stop of ${id} requested`);
      await load();
    } catch (err) { head.append(errorBox(err)); }
  }

  async function changeTag(method, value) {
    try { await api(method, `${jobPath(id)}/tag`, { body: { value } }); await load(); } catch (err) { head.append(errorBox(err)); }
  }

  let shownKey = "";
  async function load({ ifChanged = false } = {}) {
    const fresh = await get(jobPath(id));
    const key = JSON.stringify(fresh);
    // A periodic re-read that finds nothing new leaves the page (and what is being typed) alone.
    if (ifChanged && key === shownKey) return;
    shownKey = key;
    detail = fresh;
    const st = detail.jobStatus;
    const owner = mine();
    const [attempts, jobEvents] = owner
      ? await Promise.all([get(`${jobPath(id)}/job-attempts`).catch(() => []), get(`${jobPath(id)}/events`).catch(() => ({ data: [] }))])
      : [[], { data: [] }];
    const canStop = owner && !FINAL_STATES.has(st.state) && st.executionType !== "STOP";
    const tagInput = h("input", { id: "new-tag", placeholder: "new tag", "aria-label": "new tag", size: "12" });
    clear(head,
      pageTitle(detail.name, " ", stateBadge(st.state)),
      h("p", { class: "muted" }, `${id} · ${st.username} · VC ${st.virtualCluster} · priority ${st.priority} · attempt ${st.attempt} · submitted ${fmtTime(st.createdTime)}`,
        st.completedTime ? ` · ran ${fmtDuration(st.appLaunchedTime || st.createdTime, st.completedTime)}` : "",
        detail.marketplaceItem ? [" · ", marketLink(detail.marketplaceItem)] : ""),
      h("div", { class: "toolbar" },
        canStop ? h("button", { type: "button", id: "stop", class: "danger", onclick: stop }, "Stop") : null,
        owner ? h("button", { type: "button", id: "clone", onclick: () => go(`/submit?clone=${encodeURIComponent(id)}`) }, "Clone") : null,
        owner ? jobFileButtons(id, detail.name, head) : null,
        owned() && st.state === "RUNNING" && runsTensorBoard(detail) ? tensorBoardButton(id) : null,  // its owner's alone
        h("span", { class: "tags", "aria-label": "tags" }, (detail.tags || []).map((t) => h("span", { class: "tag" }, t,
          owner ? h("button", { type: "button", class: "ghost small", "aria-label": `remove tag ${t}`, onclick: () => changeTag("DELETE", t) }, "✕") : null))),
        owner ? h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); if (tagInput.value.trim()) changeTag("PUT", tagInput.value.trim()); } },
          tagInput, h("button", { type: "submit" }, "Add tag")) : null));

    const sections = [];
    if (st.state === "WAITING" && st.waitingReason) {
      sections.push(h("section", { class: "card waiting", id: "waiting", "aria-labelledby": "waiting-title" },
        h("h2", { id: "waiting-title" }, "Why it waits"), h("p", { id: "waiting-reason" }, st.waitingReason),
        h("p", {}, h("a", { href: `#/vcs/${encodeURIComponent(st.virtualCluster)}` }, `The queue of ${st.virtualCluster}`))));
    }
    if (st.state === "FAILED" || (st.appExitSpec && st.appExitCode)) {
      sections.push(exitSpecBox(st.appExitSpec, st.appExitCode, st.appExitDiagnostics, st.state === "FAILED" ? "Why it failed" : "Last exit"));
    }
    for (const note of [...(detail.warnings || []), ...(detail.notes || [])]) sections.push(h("p", { class: "note" }, note));

    // Tasks of the current attempt.
    const taskRows = [];
    const options = [];
    for (const [role, r] of Object.entries(detail.taskRoles)) {
      for (const t of r.taskStatuses) {
        options.push(`${role}/${t.taskIndex}`);
        const ports = t.containerPorts ? Object.entries(t.containerPorts).map(([k, v]) => `${k}:${v}`).join(" ") : "";
        taskRows.push(h("tr", {},
          h("th", { scope: "row" }, `${role}[${t.taskIndex}]`), h("td", {}, stateBadge(t.taskState)),
          h("td", {}, t.containerNodeName || "–"), h("td", {}, t.containerGpus || "–"), h("td", {}, ports || "–"),
          h("td", { class: "num" }, t.containerExitCode ?? "–"),
          h("td", {}, t.containerExitSpec ? t.containerExitSpec.phrase : ""), h("td", { class: "num" }, String(t.retries ?? 0)),
          h("td", {}, owner ? h("button", { type: "button", class: "small", onclick: () => { logSelect.value = `${role}/${t.taskIndex}`; loadLog(); logBox.focus(); } }, "Log") : "",
            owner && st.state === "RUNNING" && t.taskState === "RUNNING"
              ? h("button", { type: "button", class: "small", dataset: { terminal: `${role}-${t.taskIndex}` }, "aria-label": `open a terminal in ${role}[${t.taskIndex}]`,
                onclick: () => terminal.open(role, t.taskIndex) }, "Terminal") : null)));
      }
    }
    sections.push(h("section", { "aria-labelledby": "tasks-title" }, h("h2", { id: "tasks-title" }, "Task roles and tasks"),
      h("div", { class: "table-wrap" }, table(["task", "state", "node", "GPUs", "ports", "exit code", "exit", "retries", ""], taskRows))));

    if (owner) sections.push(terminal.section);
    if (owner) sections.push(metrics.section);
    if (owned()) sections.push(ssh.section);
    if (owner) {
      const previous = logSelect.value;
      clear(logSelect, options.map((o) => h("option", { value: o }, o)));
      if (previous && options.includes(previous)) logSelect.value = previous;
      sections.push(h("section", { "aria-labelledby": "log-title" }, h("h2", { id: "log-title" }, "Log"),
        h("div", { class: "toolbar" }, h("label", { for: "log-task" }, "Task"), logSelect, logState,
          h("button", { type: "button", id: "log-download", onclick: () => {
            const [role, index] = logSelect.value.split("/");
            download(`${jobPath(id)}/logs?taskRole=${encodeURIComponent(role)}&taskIndex=${index}`, `${id}-${role}-${index}.log`);
          } }, "Download whole log")),
        logBox));

      // Attempts and their timeline.
      const attemptItems = attempts.map((a) => h("li", {},
        h("strong", {}, `Attempt ${a.attempt ?? a.attemptIndex + 1}`), " ", stateBadge(a.state),
        ` created ${fmtTime(a.createdTime)}`, a.launchedTime ? `, launched ${fmtTime(a.launchedTime)}` : "",
        a.completedTime ? `, ended ${fmtTime(a.completedTime)}` : "",
        a.exitCode !== null && a.exitCode !== undefined ? `, exit ${a.exitCode}${a.exitSpec ? " (" + a.exitSpec.phrase + ")" : ""}` : "",
        a.endReason ? ` — ${a.endReason}` : "", a.preemptedBy ? ` — preempted by ${a.preemptedBy}` : ""));
      const timeline = jobEvents.data.map((e) => h("li", { class: e.type === "Warning" ? "warn" : "" },
        h("time", { datetime: new Date(e.firstTimestamp).toISOString() }, fmtTime(e.firstTimestamp)), " ", h("strong", {}, e.reason), " ", e.message));
      sections.push(h("div", { class: "two" },
        h("section", { "aria-labelledby": "attempts-title" }, h("h2", { id: "attempts-title" }, "Attempts"), h("ol", { class: "attempts", reversed: true }, attemptItems)),
        h("section", { "aria-labelledby": "timeline-title" }, h("h2", { id: "timeline-title" }, "Timeline"), h("ol", { class: "timeline", id: "timeline" }, timeline))));
      const config = h("pre", { class: "log small", id: "config" }, "…");
      const configBox = h("details", { id: "config-box" }, h("summary", {}, "Config (secrets masked)"), config);
      configBox.addEventListener("toggle", async () => {
        if (configBox.open) { try { config.textContent = await api("GET", `${jobPath(id)}/config`, { accept: "text/yaml" }); } catch (err) { config.textContent = err.message; } }
      }, { once: true });
      sections.push(h("section", { "aria-label": "config" }, configBox));
    } else {
      sections.push(h("p", { class: "muted" }, `Logs, attempts and the config of ${id} are for ${st.username} and admins.`));
    }
    clear(body, sections);
    if (owner) { await loadLog(); if (!FINAL_STATES.has(st.state)) scheduleLog(); }
    if (owned()) await ssh.update(st.state);
    if (owner && !metricsStarted && st.state !== "WAITING") { metricsStarted = true; metrics.start(); }
  }

  clear(main, head, body);
  await load();
  let pending = null;
  const off = events.subscribe((ev) => {
    if (ev.job !== id) return;
    announce(`${id} is ${ev.state}`);
    clearTimeout(pending);
    pending = setTimeout(() => load().catch(() => {}), 200);
  });
  // Others' jobs are not on a user's stream; and a missed event must not freeze the page.
  const timer = setInterval(() => { if (!FINAL_STATES.has(detail.jobStatus.state)) load({ ifChanged: true }).catch(() => {}); }, 10000);
  return () => { stopped = true; metrics.stop(); terminal.close(); off(); clearTimeout(pending); clearTimeout(logTimer); clearInterval(timer); };
}
