// Submit: YAML (or JSON) pasted, uploaded, from an example or cloned from a past job.
// One validator, the server's: "Check" posts with dryRun=true, and errors come back
// with their field path and line, marked in the gutter beside that line.

import { api, jobPath } from "../api.js";
import { announce, clear, h, pageTitle } from "../dom.js";
import { EXAMPLES } from "../examples.js";
import { marketPrefill } from "./market_submit.js";
import { exportYaml, saveAsTemplate } from "../jobfile.js";

// The line of a field path in block-style YAML, for errors the server could not
// place (e.g. "defaults.virtualCluster" refused after parsing). Best effort: null if not found.
export function lineOfPath(text, path) {
  const parts = path.replace(/\[(\d+)\]/g, ".$1").split(".").filter(Boolean);
  const lines = text.split("\n");
  let from = 0, indent = -1, found = null;
  for (const part of parts) {
    let hit = null;
    for (let i = from; i < lines.length; i++) {
      const m = lines[i].match(/^(\s*)(-\s+)?([^\s:#][^:]*?)\s*:(\s|$)/);
      if (!m) continue;
      const ind = m[1].length;
      if (ind <= indent && i > from) break;
      if (m[3].replace(/^["']|["']$/g, "") === part && ind > indent) { hit = i; indent = ind; break; }
    }
    if (hit === null) return found;
    found = hit + 1;
    from = hit + 1;
  }
  return found;
}

function topLevelBlock(text, key) {
  // [start, end) line indices of a top-level `key:` block, or null.
  const lines = text.split("\n");
  const start = lines.findIndex((l) => new RegExp(`^${key}\\s*:`).test(l));
  if (start < 0) return null;
  let end = start + 1;
  while (end < lines.length && (/^\s+\S/.test(lines[end]) || lines[end].trim() === "")) end++;
  while (end > start + 1 && lines[end - 1].trim() === "") end--;
  return [start, end];
}

function readPairs(text, key) {
  const block = topLevelBlock(text, key);
  if (!block) return [];
  const out = [];
  for (const l of text.split("\n").slice(block[0] + 1, block[1])) {
    const m = l.match(/^\s+([A-Za-z_][\w-]*)\s*:\s*(.*)$/);
    if (m) { let v = m[2].trim(); try { if (/^["']/.test(v)) v = v.startsWith('"') ? JSON.parse(v) : v.slice(1, -1); } catch { /* as written */ } out.push([m[1], v]); }
  }
  return out;
}

function writeBlock(text, key, pairs) {
  const lines = text.split("\n");
  const block = topLevelBlock(text, key);
  const kept = pairs.filter(([k]) => k.trim());
  const body = kept.length ? [`${key}:`, ...kept.map(([k, v]) => `  ${k.trim()}: ${JSON.stringify(String(v))}`)] : [];
  if (block) lines.splice(block[0], block[1] - block[0], ...body);
  else if (body.length) {
    const at = lines.findIndex((l) => /^taskRoles\s*:/.test(l));
    lines.splice(at < 0 ? lines.length : at, 0, ...body);
  }
  return lines.join("\n");
}

export async function render(main, { params, go }) {
  const editor = h("textarea", { id: "job-text", class: "code", spellcheck: "false", "aria-describedby": "job-errors-summary", wrap: "off", rows: "24" });
  const gutter = h("div", { class: "gutter", "aria-hidden": "true" });
  const errorsList = h("ol", { id: "job-errors", class: "errors" });
  const summary = h("p", { id: "job-errors-summary", role: "status" });
  const result = h("div", { role: "alert" });
  let marks = new Map(); // line -> messages

  function drawGutter() {
    const count = editor.value.split("\n").length;
    const frag = document.createDocumentFragment();
    for (let i = 1; i <= count; i++) {
      const msgs = marks.get(i);
      frag.append(h("div", { class: msgs ? "ln err" : "ln", "data-line": String(i), title: msgs ? msgs.join("\n") : null }, msgs ? `⚠ ${i}` : String(i)));
    }
    clear(gutter, frag);
    gutter.scrollTop = editor.scrollTop;
  }
  editor.addEventListener("input", () => { if (marks.size) { marks = new Map(); } drawGutter(); syncFields(); });
  editor.addEventListener("scroll", () => { gutter.scrollTop = editor.scrollTop; });

  function goToLine(n) {
    if (formMode) setMode(false);
    const lines = editor.value.split("\n");
    const start = lines.slice(0, n - 1).reduce((a, l) => a + l.length + 1, 0);
    editor.focus();
    editor.setSelectionRange(start, start + (lines[n - 1] || "").length);
    const lh = parseFloat(getComputedStyle(editor).lineHeight) || 18;
    editor.scrollTop = Math.max(0, (n - 5) * lh);
  }

  function showErrors(errors) {
    marks = new Map();
    clear(errorsList);
    for (const e of errors) {
      const line = e.line || (e.path ? lineOfPath(editor.value, e.path) : null);
      if (line) marks.set(line, [...(marks.get(line) || []), `${e.path}: ${e.message}`]);
      errorsList.append(h("li", { class: "error-item", "data-line": line ? String(line) : "" },
        line ? h("button", { type: "button", class: "link", onclick: () => goToLine(line) }, `line ${line}`) : h("span", {}, "document"),
        " ", h("code", {}, e.path || "$"), " ", e.message));
    }
    summary.textContent = errors.length ? `${errors.length} problem(s) in the job config` : "";
    summary.className = errors.length ? "error-text" : "";
    drawGutter();
  }

  // --- parameters and secrets ------------------------------------------------------------
  const paramRows = h("div", { class: "pairs", id: "param-rows" });
  const secretRows = h("div", { class: "pairs", id: "secret-rows" });
  function pairRow(container, kind, k = "", v = "", secret = false) {
    const n = container.children.length;
    const key = h("input", { value: k, "aria-label": `${kind} ${n + 1} name`, placeholder: "name", class: "pair-key" });
    const val = h("input", { value: v, "aria-label": `${kind} ${n + 1} value`, placeholder: "value", type: secret ? "password" : "text", class: "pair-value", autocomplete: "off" });
    const row = h("div", { class: "pair" }, key, val, h("button", { type: "button", class: "ghost", "aria-label": `remove ${kind} ${n + 1}`, onclick: () => { row.remove(); changed(); } }, "✕"));
    const changed = () => { if (!secret) { editor.value = writeBlock(editor.value, "parameters", pairs(paramRows)); drawGutter(); if (formMode) form.show(editor.value); } };
    key.addEventListener("input", changed); val.addEventListener("input", changed);
    container.append(row);
    return row;
  }
  const pairs = (c) => [...c.querySelectorAll(".pair")].map((r) => [r.querySelector(".pair-key").value, r.querySelector(".pair-value").value]);
  function syncFields() {
    if (document.activeElement && paramRows.contains(document.activeElement)) return;
    clear(paramRows);
    for (const [k, v] of readPairs(editor.value, "parameters")) pairRow(paramRows, "parameter", k, v);
  }
  // Secrets never enter the editor (nor a screenshot of it): they are added to the
  // document only as it is sent, after its last line, so error lines stay true.
  function withSecrets(text) {
    const given = pairs(secretRows).filter(([k]) => k.trim());
    if (!given.length || topLevelBlock(text, "secrets")) return text;
    return text.replace(/\n*$/, "\n") + `secrets:\n${given.map(([k, v]) => `  ${k.trim()}: ${JSON.stringify(v)}`).join("\n")}\n`;
  }

  async function send(dryRun) {
    clear(result);
    const text = editor.value;
    const json = /^\s*[{[]/.test(text);
    try {
      const got = await api("POST", `/api/v2/jobs${dryRun ? "?dryRun=true" : ""}`, { body: withSecrets(text), contentType: json ? "application/json" : "text/yaml" });
      showErrors([]);
      const notes = [...(got.warnings || [])];
      if (dryRun) {
        result.append(h("div", { class: "ok-box" }, `The job config is valid: it would be ${got.job}.`, notes.length ? h("ul", {}, notes.map((w) => h("li", {}, w))) : ""));
        announce("The job config is valid");
      } else {
        announce(`Submitted ${got.job}`);
        go(`/jobs/${encodeURIComponent(got.job)}`);
      }
    } catch (err) {
      const errors = (err.body && (err.body.errors || (err.body.details && err.body.details.errors))) || [];
      showErrors(errors);
      result.append(h("div", { class: "error-box" }, err.message));
      announce(`Not ${dryRun ? "valid" : "submitted"}: ${err.message}`);
    }
  }

  function load(text) {
    editor.value = text; marks = new Map(); clear(errorsList); summary.textContent = ""; clear(result); drawGutter(); syncFields();
    if (formMode) setMode(true);
  }

  // --- the form, beside the YAML it makes (js/pages/submit_form.js) -----------------------
  let formMode = false;
  // Loaded with this page, not with the portal: the form brings js-yaml (about 100 KB).
  const { jobForm } = await import("./submit_form.js");
  const form = jobForm({ onYaml: (text) => { editor.value = text; marks = new Map(); drawGutter(); syncFields(); } });
  const editorWrap = h("div", { class: "editor-wrap" }, h("label", { for: "job-text", class: "sr-only" }, "Job config (YAML or JSON)"), gutter, editor);
  const formWrap = h("div", { id: "form-wrap", hidden: true }, form.element);
  const modeNote = h("div", { role: "status", id: "mode-note" });
  const formButton = h("button", { type: "button", id: "mode-form", "aria-pressed": "false", onclick: () => setMode(true) }, "Form");
  const yamlButton = h("button", { type: "button", id: "mode-yaml", "aria-pressed": "true", onclick: () => setMode(false) }, "YAML editor");
  async function setMode(toForm) {
    clear(modeNote);
    if (toForm) {
      const why = await form.show(editor.value);
      if (why) {  // the editor's text is not a job the form can show: stay on it, saying why
        modeNote.append(h("div", { class: "error-box" }, `The form cannot show this document (${why}); fix it in the editor, or start from an example.`));
        announce("The form cannot show this document");
        toForm = false;
      }
    }
    formMode = toForm;
    formWrap.hidden = !toForm;
    editorWrap.hidden = toForm;
    formButton.setAttribute("aria-pressed", String(toForm));
    yamlButton.setAttribute("aria-pressed", String(!toForm));
    if (!toForm) drawGutter();
  }
  const jobName = () => { const m = editor.value.match(/^name:\s*["']?([^"'\n#]+?)["']?\s*$/m); return m ? m[1] : "job"; };

  const exampleSelect = h("select", { id: "example", onchange: () => { if (exampleSelect.value) load(EXAMPLES[exampleSelect.value]); } },
    h("option", { value: "" }, "— choose —"), Object.keys(EXAMPLES).map((k) => h("option", { value: k }, k)));
  const upload = h("input", { id: "upload", type: "file", accept: ".yaml,.yml,.json,text/yaml,application/json", onchange: async () => {
    const f = upload.files[0]; if (f) load(await f.text());
  } });

  clear(main, pageTitle("Submit a job"),
    h("div", { class: "submit-tools" },
      h("div", { class: "field" }, h("label", { for: "example" }, "Start from an example"), exampleSelect),
      h("div", { class: "field" }, h("label", { for: "upload" }, "Upload a YAML or JSON file"), upload),
      h("p", { class: "hint" }, "Or paste a job; to clone a past job use its ", h("em", {}, "Clone"), " button.")),
    h("div", { class: "toolbar", role: "group", "aria-label": "Edit the job with" }, formButton, yamlButton,
      h("button", { type: "button", id: "export-yaml", onclick: () => exportYaml(editor.value, jobName()) }, "Export as YAML"),
      h("button", { type: "button", id: "save-template", onclick: () => saveAsTemplate(editor.value, jobName(), result) }, "Save as template")),
    modeNote, editorWrap, formWrap,
    summary, errorsList,
    h("div", { class: "two" },
      h("fieldset", {}, h("legend", {}, "Parameters"), h("p", { class: "hint" }, "Used as ", h("code", {}, "<% $parameters.name %>"), "; written into the YAML."),
        paramRows, h("button", { type: "button", onclick: () => pairRow(paramRows, "parameter").querySelector("input").focus() }, "Add parameter")),
      h("fieldset", {}, h("legend", {}, "Secrets"), h("p", { class: "hint" }, "Used as ", h("code", {}, "<% $secrets.name %>"), "; sent sealed, never shown again."),
        secretRows, h("button", { type: "button", onclick: () => pairRow(secretRows, "secret", "", "", true).querySelector("input").focus() }, "Add secret"))),
    h("div", { class: "toolbar" },
      h("button", { type: "button", id: "check", onclick: () => send(true) }, "Check"),
      h("button", { type: "button", id: "submit", class: "primary", onclick: () => send(false) }, "Submit")),
    result);

  const clone = params.get("clone");
  // From a marketplace template (js/pages/market_submit.js): its job, parameters filled in.
  const market = params.get("market") ? await marketPrefill(params).catch((err) => err) : null;
  if (market instanceof Error) {
    load(EXAMPLES.hello);
    result.append(h("div", { class: "error-box" }, `Could not open the template ${params.get("market")}: ${market.message}`));
  } else if (market) {
    load(market.text);
    result.append(market.note);
  } else if (clone) {
    try {
      const text = await api("GET", `${jobPath(clone)}/config`, { accept: "text/yaml" });
      const name = clone.split("~").slice(1).join("~");
      const fresh = `${name.replace(/-clone\d*$/, "")}-clone${Date.now() % 100000}`;
      load(text.replace(new RegExp(`^name:\\s*.*$`, "m"), `name: ${fresh}`));
      result.append(h("p", { class: "hint" }, `Cloned from ${clone} and renamed ${fresh}. Secrets are not copied: enter them again.`));
    } catch (err) { result.append(h("div", { class: "error-box" }, `Could not clone ${clone}: ${err.message}`)); }
  } else {
    load(EXAMPLES.hello);
  }
  if (params.get("form")) await setMode(true);
}
