// The submit page's form: a job built field by field (task roles, instances, resources
// per sku, image, command, ports, retries, storages, the SSH and TensorBoard plugins),
// its YAML shown beside it as it is made. The page's editor stays the one source of the
// job: the form reads the editor's document when it opens and writes its YAML back into
// the editor on every change (js/jobform.js; what the form does not show is kept).

import { get, session } from "../api.js";
import { clear, h } from "../dom.js";
import { PRIORITY_CLASSES, parseJob, readForm, toYaml, unshown, writeForm } from "../jobform.js";

const blankRole = (n) => ({ key: undefined, name: n === 0 ? "main" : `role${n + 1}`, instances: 1, cpu: 1, memoryMB: 1024, gpu: 0,
  sku: "", image: "", command: "", ports: [], taskRetryCount: 0 });

// `onYaml(text)` gets the form's YAML on each change; `show(text)` (re)opens the form on a
// document and answers null, or the reason it cannot (then the page stays on the editor).
export function jobForm({ onYaml }) {
  let base = {};
  let form = null;
  let skuTypes = {};
  let storagesKnown = [];
  const box = h("div", { id: "job-form", class: "job-form" });
  const preview = h("pre", { id: "form-yaml", class: "log", tabindex: "0", "aria-label": "the job's YAML, as the form makes it" });
  const notShown = h("div", { id: "form-unshown", role: "note" });
  const element = h("div", { class: "form-split" },
    h("div", {}, box, notShown),
    h("section", { "aria-labelledby": "form-yaml-title", class: "form-preview" }, h("h2", { id: "form-yaml-title" }, "YAML"),
      h("p", { class: "hint" }, "What the form makes, as it will be submitted (parameters below included; secrets never)."), preview));

  function emit() {
    const doc = writeForm(base, form);
    const text = toYaml(doc);
    preview.textContent = text;
    onYaml(text);
  }

  const id = (...parts) => parts.join("-");
  function field(label, control, hint) {
    return h("div", { class: "field" }, h("label", { for: control.id }, label), control, hint ? h("span", { class: "hint" }, hint) : null);
  }
  function input(idText, value, set, attrs = {}) {
    const el = h("input", { id: idText, value: value ?? "", autocomplete: "off", ...attrs });
    el.addEventListener("input", () => { set(el.value); emit(); });
    return el;
  }
  function numberInput(idText, value, set, attrs = {}) { return input(idText, value, set, { type: "number", min: "0", size: "6", ...attrs }); }

  async function loadSkus(vc) {
    try { skuTypes = vc ? await get(`/api/v2/cluster/sku-types?vc=${encodeURIComponent(vc)}`) : {}; } catch { skuTypes = {}; }
  }

  function roleSection(role, i) {
    const n = i + 1;
    const skuSelect = h("select", { id: id("role", i, "sku") },
      h("option", { value: "" }, "any"),
      [...new Set([...Object.keys(skuTypes), ...(role.sku ? [role.sku] : [])])].map((s) => h("option", { value: s, selected: s === role.sku }, s)));
    const count = h("input", { id: id("role", i, "sku-count"), type: "number", min: "1", size: "4", value: "1" });
    const cpu = numberInput(id("role", i, "cpu"), role.cpu, (v) => { role.cpu = v; });
    const mem = numberInput(id("role", i, "memory"), role.memoryMB, (v) => { role.memoryMB = v; }, { size: "8" });
    const gpu = numberInput(id("role", i, "gpu"), role.gpu, (v) => { role.gpu = v; });
    const sku = skuTypes[role.sku];
    if (sku) count.value = String(Math.max(1, sku.gpu ? Math.round(role.gpu / sku.gpu) : Math.round(role.cpu / (sku.cpu || 1))));
    // Resources per sku: the role's cpu, memory and GPUs are the sku's times the count.
    const fromSku = () => {
      role.sku = skuSelect.value;
      const s = skuTypes[role.sku];
      if (s) {
        const k = Math.max(1, Number(count.value) || 1);
        role.cpu = s.cpu * k; role.memoryMB = s.memory * k; role.gpu = s.gpu * k;
        cpu.value = String(role.cpu); mem.value = String(role.memoryMB); gpu.value = String(role.gpu);
      }
      emit();
    };
    skuSelect.addEventListener("change", fromSku);
    count.addEventListener("input", fromSku);
    const command = h("textarea", { id: id("role", i, "command"), class: "code-input", rows: "4", spellcheck: "false" }, role.command);
    command.addEventListener("input", () => { role.command = command.value; emit(); });
    const ports = h("div", { class: "pairs", id: id("role", i, "ports") });
    const drawPorts = () => clear(ports, role.ports.map((p, j) => h("div", { class: "pair" },
      h("input", { value: p.label, "aria-label": `role ${n} port ${j + 1} label`, placeholder: "label", oninput: (e) => { p.label = e.target.value; emit(); } }),
      h("input", { value: String(p.count), type: "number", min: "1", size: "4", "aria-label": `role ${n} port ${j + 1} count`, oninput: (e) => { p.count = e.target.value; emit(); } }),
      h("button", { type: "button", class: "ghost", "aria-label": `remove role ${n} port ${j + 1}`, onclick: () => { role.ports.splice(j, 1); drawPorts(); emit(); } }, "✕"))));
    drawPorts();
    return h("fieldset", { class: "role", id: id("role", i) },
      h("legend", {}, `Task role ${n}`),
      h("div", { class: "filters" },
        field("Name", input(id("role", i, "name"), role.name, (v) => { role.name = v; }, { required: true, pattern: "[A-Za-z0-9_]+", size: "14" })),
        field("Instances", numberInput(id("role", i, "instances"), role.instances, (v) => { role.instances = v; }, { min: "1" })),
        field("Sku", skuSelect), field("Skus per instance", count),
        field("CPUs", cpu), field("Memory (MB)", mem), field("GPUs", gpu),
        field("Task retries", numberInput(id("role", i, "retries"), role.taskRetryCount, (v) => { role.taskRetryCount = v; }))),
      field("Image", input(id("role", i, "image"), role.image, (v) => { role.image = v; }, { size: "40", placeholder: "none: a process on the node" })),
      field("Command (one per line)", command),
      h("div", { class: "field" }, h("span", { class: "label-spacer" }, "Ports"), ports,
        h("div", { class: "toolbar" },
          h("button", { type: "button", class: "small", onclick: () => { role.ports.push({ label: "http", count: 1 }); drawPorts(); emit(); ports.querySelector(".pair:last-child input").focus(); } }, `Add a port to role ${n}`),
          form.roles.length > 1 ? h("button", { type: "button", class: "small danger", onclick: () => { form.roles.splice(i, 1); draw(); emit(); document.getElementById("form-add-role").focus(); } }, `Remove task role ${n}`) : null)));
  }

  function draw() {
    const vcs = [...new Set([...(session.me.virtualCluster || []), ...(form.virtualCluster ? [form.virtualCluster] : [])])];
    const vcSelect = h("select", { id: "form-vc" }, h("option", { value: "" }, "— choose —"), vcs.map((v) => h("option", { value: v, selected: v === form.virtualCluster }, v)));
    // The VC's skus come from the API; the form is busy (aria-busy) until they are drawn.
    vcSelect.addEventListener("change", async () => {
      form.virtualCluster = vcSelect.value;
      box.setAttribute("aria-busy", "true");
      try { await loadSkus(form.virtualCluster); draw(); emit(); } finally { box.removeAttribute("aria-busy"); }
    });
    const priority = h("select", { id: "form-priority" }, h("option", { value: "" }, "the VC's default"),
      PRIORITY_CLASSES.map((p) => h("option", { value: p, selected: p === form.priorityClass }, p)));
    priority.addEventListener("change", () => { form.priorityClass = priority.value; emit(); });
    const description = h("textarea", { id: "form-description", rows: "2", cols: "50" }, form.description);
    description.addEventListener("input", () => { form.description = description.value; emit(); });
    const known = new Map(storagesKnown.map((s) => [s.name, s]));
    for (const name of form.storages) if (!known.has(name)) known.set(name, { name, mountPath: "?" });
    const storageBoxes = [...known.values()].map((s) => {
      const box2 = h("input", { type: "checkbox", id: `form-storage-${s.name}`, checked: form.storages.includes(s.name) });
      box2.addEventListener("change", () => { form.storages = box2.checked ? [...form.storages, s.name] : form.storages.filter((x) => x !== s.name); emit(); });
      return h("label", { class: "inline", for: box2.id }, box2, `${s.name}`, h("span", { class: "muted" }, ` at ${s.mountPath}${s.readOnly ? ", read-only" : ""}`));
    });
    const ssh = h("input", { type: "checkbox", id: "form-ssh", checked: form.ssh });
    ssh.addEventListener("change", () => { form.ssh = ssh.checked; emit(); });
    const tb = h("input", { type: "checkbox", id: "form-tensorboard", checked: form.tensorboard });
    const logdir = input("form-tb-logdir", form.tensorboardLogdir, (v) => { form.tensorboardLogdir = v; }, { placeholder: "/mnt/logs", size: "24" });
    tb.addEventListener("change", () => { form.tensorboard = tb.checked; emit(); });
    // Drawn again while someone types (the skus of a VC just chosen arrive): the field
    // they were in keeps the focus and the caret, so no keystroke goes astray.
    const focused = document.activeElement && box.contains(document.activeElement) && document.activeElement.id
      ? { id: document.activeElement.id, start: document.activeElement.selectionStart, end: document.activeElement.selectionEnd } : null;
    clear(box,
      h("fieldset", {}, h("legend", {}, "Job"),
        h("div", { class: "filters" },
          field("Job name", input("form-name", form.name, (v) => { form.name = v; }, { required: true, size: "24" })),
          field("Virtual cluster", vcSelect), field("Priority class", priority),
          field("Job retries", numberInput("form-job-retries", form.jobRetryCount, (v) => { form.jobRetryCount = v; }))),
        field("Description", description)),
      form.roles.map(roleSection),
      h("div", { class: "toolbar" }, h("button", { type: "button", id: "form-add-role", onclick: () => {
        form.roles.push(blankRole(form.roles.length)); draw(); emit();
        document.getElementById(`role-${form.roles.length - 1}-name`).focus();
      } }, "Add a task role")),
      h("fieldset", {}, h("legend", {}, "Storages"),
        storageBoxes.length ? h("div", { class: "stack" }, storageBoxes) : h("p", { class: "muted" }, "No storage is granted to your groups.")),
      h("fieldset", {}, h("legend", {}, "Plugins"),
        h("div", { class: "stack" },
          h("label", { class: "inline", for: "form-ssh" }, ssh, "SSH into the tasks (with your profile's SSH keys and the job's own key)"),
          h("div", { class: "filters" }, h("label", { class: "inline", for: "form-tensorboard" }, tb, "TensorBoard"), field("Log directory", logdir)))));
    const again = focused && document.getElementById(focused.id);
    if (again) {
      again.focus();
      if (typeof again.setSelectionRange === "function" && focused.start != null) {
        try { again.setSelectionRange(focused.start, focused.end); } catch { /* a number input has no caret to set */ }
      }
    }
  }

  async function show(text) {
    let doc;
    try { doc = parseJob(text); } catch (err) { return err.message; }
    base = doc;
    form = readForm(doc);
    if (!form.roles.length) form.roles.push(blankRole(0));
    const [, storages] = await Promise.all([loadSkus(form.virtualCluster), get("/api/v2/storages").catch(() => ({ storages: [] }))]);
    storagesKnown = storages.storages || [];
    draw();
    const left = unshown(doc);
    clear(notShown, left.length
      ? h("div", { class: "note-box" }, h("strong", {}, "Not in the form, kept as written: "), left.map((p, i) => [i ? ", " : "", h("code", {}, p)]),
        ". Change them in the YAML editor.")
      : null);
    preview.textContent = toYaml(writeForm(base, form));
    return null;
  }

  return { element, show };
}
