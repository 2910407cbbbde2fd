// The submit form's model: an OpenPAI v2 job document <-> the fields the form shows.
// Pure (no DOM): `readForm` takes what the form shows out of a document, `writeForm`
// puts the form's values back into a copy of it, and `unshown` names what the form
// leaves as written. Whatever the form does not show is kept, so going YAML -> form ->
// YAML loses nothing but comments and the YAML's own layout (js-yaml writes it anew).

import { dump, load } from "../vendor/js-yaml/js-yaml.js";

export const PLUGINS = "com.microsoft.pai.runtimeplugin";
const TOP = new Set(["protocolVersion", "name", "type", "description", "jobRetryCount", "prerequisites",
  "parameters", "secrets", "taskRoles", "defaults", "extras"]);
const ROLE = new Set(["instances", "dockerImage", "resourcePerInstance", "commands", "taskRetryCount"]);
const RESOURCES = new Set(["cpu", "memoryMB", "gpu", "ports"]);
const SHOWN_PLUGINS = new Set(["ssh", "tensorboard", "teamwise_storage"]);
export const PRIORITY_CLASSES = ["crit", "prod", "test", "oppo"];

const isMap = (x) => x !== null && typeof x === "object" && !Array.isArray(x);
const clone = (x) => (x === undefined ? undefined : JSON.parse(JSON.stringify(x)));

// The document in `text` (YAML or JSON), or an Error saying why the form cannot show it.
export function parseJob(text) {
  let doc;
  try { doc = load(text); } catch (err) { throw new Error(`not YAML the form can read: ${err.reason || err.message}`); }
  if (doc === undefined || doc === null) doc = {};
  if (!isMap(doc)) throw new Error("the document is not a mapping of fields (protocolVersion, name, taskRoles, ...)");
  if (doc.taskRoles !== undefined && !isMap(doc.taskRoles)) throw new Error("taskRoles is not a mapping of role names to roles");
  for (const [name, role] of Object.entries(doc.taskRoles || {})) {
    if (!isMap(role)) throw new Error(`taskRoles.${name} is not a mapping`);
    if (role.commands !== undefined && !Array.isArray(role.commands)) throw new Error(`taskRoles.${name}.commands is not a list`);
  }
  if (doc.prerequisites !== undefined && !Array.isArray(doc.prerequisites)) throw new Error("prerequisites is not a list");
  if (doc.extras !== undefined && !isMap(doc.extras)) throw new Error("extras is not a mapping");
  if (doc.extras && doc.extras[PLUGINS] !== undefined && !Array.isArray(doc.extras[PLUGINS])) throw new Error(`extras.${PLUGINS} is not a list`);
  return doc;
}

export function toYaml(doc) {
  return dump(doc, { lineWidth: -1, noRefs: true, quotingType: '"' });
}

function plugins(doc) { return (doc.extras && Array.isArray(doc.extras[PLUGINS])) ? doc.extras[PLUGINS] : []; }
function plugin(doc, name) { return plugins(doc).find((p) => isMap(p) && p.plugin === name); }
function images(doc) { return (doc.prerequisites || []).filter((p) => isMap(p) && p.type === "dockerimage"); }

export function readForm(doc) {
  const hived = (doc.extras && isMap(doc.extras.hivedScheduler)) ? doc.extras.hivedScheduler : {};
  const hivedRoles = isMap(hived.taskRoles) ? hived.taskRoles : {};
  const imageOf = (name) => { const p = images(doc).find((x) => x.name === name); return p ? String(p.uri ?? "") : ""; };
  const storage = plugin(doc, "teamwise_storage");
  const storages = Array.isArray(doc.extras && doc.extras.storages)
    ? doc.extras.storages.map((s) => (isMap(s) ? s.name : s)).filter(Boolean)
    : (storage && isMap(storage.parameters) && Array.isArray(storage.parameters.storageConfigNames) ? storage.parameters.storageConfigNames : []);
  const tb = plugin(doc, "tensorboard");
  const tbParams = tb && isMap(tb.parameters) ? tb.parameters : {};
  return {
    name: doc.name ?? "",
    description: doc.description ?? "",
    virtualCluster: (isMap(doc.defaults) && doc.defaults.virtualCluster) || "",
    jobRetryCount: doc.jobRetryCount ?? 0,
    priorityClass: hived.jobPriorityClass || "",
    ssh: Boolean(plugin(doc, "ssh")),
    tensorboard: Boolean(tb),
    tensorboardLogdir: (isMap(tbParams.logdir) ? tbParams.logdir.path : tbParams.logdir) || "",
    storages: storages.map(String),
    roles: Object.entries(doc.taskRoles || {}).map(([name, r]) => {
      const res = isMap(r.resourcePerInstance) ? r.resourcePerInstance : {};
      return {
        key: name, // the name it had in the document, so renames keep what the form does not show
        name,
        instances: r.instances ?? 1,
        cpu: res.cpu ?? 1,
        memoryMB: res.memoryMB ?? 1024,
        gpu: res.gpu ?? 0,
        sku: (isMap(hivedRoles[name]) && hivedRoles[name].skuType) || "",
        image: r.dockerImage ? imageOf(r.dockerImage) : "",
        command: (r.commands || []).map(String).join("\n"),
        ports: Object.entries(isMap(res.ports) ? res.ports : {}).map(([label, count]) => ({ label, count })),
        taskRetryCount: r.taskRetryCount ?? 0,
      };
    }),
  };
}

function setOrDelete(obj, key, value, keep) {
  if (keep(value)) obj[key] = value; else delete obj[key];
}

// The job's plugin list with `name`'s entry made by `make(entry)` (null: removed), in its place.
function setPlugin(doc, name, make) {
  doc.extras = isMap(doc.extras) ? doc.extras : {};
  const list = [...plugins(doc)];
  const at = list.findIndex((p) => isMap(p) && p.plugin === name);
  const made = make(at >= 0 ? list[at] : null);
  if (at >= 0 && made) list[at] = made; else if (at >= 0) list.splice(at, 1); else if (made) list.push(made);
  if (list.length) doc.extras[PLUGINS] = list; else delete doc.extras[PLUGINS];
}

const number = (v, fallback) => { const n = Number(v); return Number.isFinite(n) && String(v).trim() !== "" ? n : fallback; };
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
const sameNumber = (a, b) => String(a).trim() === String(b).trim();

// A copy of `doc` with the form's values in it. Only what the form changed is written:
// a field it shows but nobody touched stays exactly as the document had it (absent,
// null, a default), and whatever it does not show is kept.
export function writeForm(original, form) {
  const doc = clone(original) || {};
  const read = readForm(doc);
  // The form started from nothing: OpenPAI's first fields first.
  const out = !doc.name && !doc.taskRoles
    ? { protocolVersion: doc.protocolVersion ?? 2, name: doc.name ?? form.name, type: doc.type ?? "job", ...doc } : doc;
  if (form.name !== read.name) out.name = form.name;
  if (form.description !== read.description) setOrDelete(out, "description", form.description, (v) => Boolean(v));
  if (!sameNumber(form.jobRetryCount, read.jobRetryCount)) out.jobRetryCount = number(form.jobRetryCount, 0);
  if (form.virtualCluster !== read.virtualCluster) {
    out.defaults = { ...(isMap(out.defaults) ? out.defaults : {}) };
    setOrDelete(out.defaults, "virtualCluster", form.virtualCluster, (v) => Boolean(v));
    if (!Object.keys(out.defaults).length) delete out.defaults;
  }

  // Images: a role's image is a dockerimage prerequisite, found by its URI or made.
  const made = [];
  const imageName = (uri, roleName) => {
    const found = [...images(doc), ...made].find((x) => String(x.uri) === uri);
    if (found) return found.name;
    const taken = new Set([...images(doc), ...made].map((x) => x.name));
    let name = taken.has("image") ? `image-${roleName}` : "image";
    for (let i = 2; taken.has(name); i++) name = `image-${roleName}-${i}`;
    made.push({ name, type: "dockerimage", uri });
    return name;
  };

  const hived = isMap(out.extras && out.extras.hivedScheduler) ? { ...out.extras.hivedScheduler } : {};
  const hivedRoles = isMap(hived.taskRoles) ? hived.taskRoles : {};
  const newHivedRoles = {};
  const roles = {};
  let imagesChanged = false;
  for (const role of form.roles) {
    const before = isMap(doc.taskRoles && doc.taskRoles[role.key]) ? doc.taskRoles[role.key] : null;
    // A new role: every field is written but those left at nothing.
    const was = read.roles.find((x) => x.key === role.key && before) || { image: "", sku: "", ports: [], taskRetryCount: 0 };
    const r = { ...(before || {}) };
    if (!sameNumber(role.instances, was.instances)) r.instances = number(role.instances, 1);
    const res = { ...(isMap(r.resourcePerInstance) ? r.resourcePerInstance : {}) };
    if (!sameNumber(role.cpu, was.cpu)) res.cpu = number(role.cpu, 1);
    if (!sameNumber(role.memoryMB, was.memoryMB)) res.memoryMB = number(role.memoryMB, 1024);
    if (!sameNumber(role.gpu, was.gpu)) res.gpu = number(role.gpu, 0);
    if (!same(role.ports, was.ports)) {
      const ports = Object.fromEntries(role.ports.filter((p) => String(p.label).trim()).map((p) => [String(p.label).trim(), number(p.count, 1)]));
      setOrDelete(res, "ports", ports, (v) => Object.keys(v).length > 0);
    }
    if (Object.keys(res).length || before === null || "resourcePerInstance" in r) r.resourcePerInstance = res;
    if (role.image.trim() !== (was.image ?? "")) {
      imagesChanged = true;
      if (role.image.trim()) r.dockerImage = imageName(role.image.trim(), role.name); else delete r.dockerImage;
    }
    if (role.command !== was.command) r.commands = role.command.split("\n").filter((l) => l.trim());
    if (!sameNumber(role.taskRetryCount, was.taskRetryCount)) r.taskRetryCount = number(role.taskRetryCount, 0);
    roles[role.name] = r;
    const hr = isMap(hivedRoles[role.key]) && before ? { ...hivedRoles[role.key] } : {};
    if (role.sku !== (was.sku ?? "")) setOrDelete(hr, "skuType", role.sku, (v) => Boolean(v));
    const hadEmpty = before && isMap(hivedRoles[role.key]) && !Object.keys(hivedRoles[role.key]).length;
    if (Object.keys(hr).length || hadEmpty) newHivedRoles[role.name] = hr;
  }
  out.taskRoles = roles;
  if (imagesChanged || made.length) {
    // A dockerimage prerequisite that a role used and none uses now goes; the others stay in place.
    const usedBefore = new Set(Object.values(original.taskRoles || {}).map((r) => isMap(r) && r.dockerImage));
    const usedNow = new Set(Object.values(roles).map((r) => r.dockerImage));
    const prereqs = (out.prerequisites || []).filter((p) => !(isMap(p) && p.type === "dockerimage" && usedBefore.has(p.name) && !usedNow.has(p.name)));
    setOrDelete(out, "prerequisites", [...prereqs, ...made], (v) => v.length > 0);
  }

  const extrasHad = isMap(out.extras);
  out.extras = { ...(extrasHad ? out.extras : {}) };
  if (form.priorityClass !== read.priorityClass) setOrDelete(hived, "jobPriorityClass", form.priorityClass, (v) => Boolean(v));
  setOrDelete(hived, "taskRoles", newHivedRoles, (v) => Object.keys(v).length > 0 || (isMap(hived.taskRoles) && Object.keys(hived.taskRoles).length === 0));
  const hivedWasEmpty = extrasHad && isMap(out.extras.hivedScheduler) && !Object.keys(out.extras.hivedScheduler).length;
  if (Object.keys(hived).length || hivedWasEmpty) out.extras.hivedScheduler = hived; else delete out.extras.hivedScheduler;
  if (form.ssh !== read.ssh) setPlugin(out, "ssh", () => (form.ssh ? { plugin: "ssh", parameters: { jobssh: true } } : null));
  if (form.tensorboard !== read.tensorboard || (form.tensorboard && form.tensorboardLogdir !== read.tensorboardLogdir)) {
    setPlugin(out, "tensorboard", (had) => {
      if (!form.tensorboard) return null;
      const params = { ...(had && isMap(had.parameters) ? had.parameters : {}) };
      if (form.tensorboardLogdir) params.logdir = { path: form.tensorboardLogdir };
      return { ...(had || { plugin: "tensorboard" }), parameters: params };
    });
  }
  if (!same(form.storages, read.storages)) {
    if (Array.isArray(out.extras.storages)) {
      // OpenPAI's web portal's form of storages: each entry's mountPath and options stay.
      const had = new Map(out.extras.storages.map((s) => [isMap(s) ? s.name : s, s]));
      out.extras.storages = form.storages.map((n) => had.get(n) || { name: n });
      if (!out.extras.storages.length) delete out.extras.storages;
    } else {
      setPlugin(out, "teamwise_storage", (had) => (form.storages.length
        ? { ...(had || { plugin: "teamwise_storage" }), parameters: { ...(had && isMap(had.parameters) ? had.parameters : {}), storageConfigNames: [...form.storages] } }
        : null));
    }
  }
  if (!Object.keys(out.extras).length && !extrasHad) delete out.extras;
  return out;
}

// The paths of what the form does not show (kept as written; the YAML editor changes them).
export function unshown(doc) {
  const paths = [];
  for (const k of Object.keys(doc)) if (!TOP.has(k)) paths.push(k);
  if (isMap(doc.defaults)) for (const k of Object.keys(doc.defaults)) if (k !== "virtualCluster") paths.push(`defaults.${k}`);
  (doc.prerequisites || []).forEach((p, i) => {
    if (!isMap(p) || p.type !== "dockerimage") paths.push(`prerequisites[${i}]${isMap(p) && p.type ? ` (${p.type})` : ""}`);
    else for (const k of Object.keys(p)) if (!["name", "type", "uri"].includes(k)) paths.push(`prerequisites[${i}].${k}`);
  });
  for (const [name, r] of Object.entries(doc.taskRoles || {})) {
    for (const k of Object.keys(r)) if (!ROLE.has(k)) paths.push(`taskRoles.${name}.${k}`);
    if (isMap(r.resourcePerInstance)) for (const k of Object.keys(r.resourcePerInstance)) if (!RESOURCES.has(k)) paths.push(`taskRoles.${name}.resourcePerInstance.${k}`);
  }
  const extras = isMap(doc.extras) ? doc.extras : {};
  for (const k of Object.keys(extras)) if (![PLUGINS, "hivedScheduler", "storages"].includes(k)) paths.push(`extras.${k}`);
  const hived = isMap(extras.hivedScheduler) ? extras.hivedScheduler : {};
  for (const k of Object.keys(hived)) if (!["jobPriorityClass", "taskRoles"].includes(k)) paths.push(`extras.hivedScheduler.${k}`);
  for (const [name, hr] of Object.entries(isMap(hived.taskRoles) ? hived.taskRoles : {})) {
    for (const k of Object.keys(isMap(hr) ? hr : {})) if (k !== "skuType") paths.push(`extras.hivedScheduler.taskRoles.${name}.${k}`);
  }
  plugins(doc).forEach((p, i) => { if (!isMap(p) || !SHOWN_PLUGINS.has(p.plugin)) paths.push(`extras.${PLUGINS}[${i}]${isMap(p) && p.plugin ? ` (${p.plugin})` : ""}`); });
  plugins(doc).forEach((p, i) => {
    // TensorBoard's log directories as a name -> path mapping or a list: the form shows one path.
    const logdir = isMap(p) && p.plugin === "tensorboard" && isMap(p.parameters) ? p.parameters.logdir : undefined;
    if (logdir !== undefined && typeof logdir !== "string" && !(isMap(logdir) && typeof logdir.path === "string" && Object.keys(logdir).length === 1)) {
      paths.push(`extras.${PLUGINS}[${i}].parameters.logdir`);
    }
  });
  return paths;
}
