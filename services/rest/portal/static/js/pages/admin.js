// Admin: users (add, edit email, admin and groups, delete), groups (add, edit description,
// external name, admin flag, VCs and storages granted, delete), storages and their grants
// (js/pages/admin_edit.js), failure rules (view, edit with the runtime's validation, reset).

import { api, get, session } from "../api.js";
import { announce, clear, errorBox, h, pageTitle, table } from "../dom.js";
import { groupEditor, storageSection, userEditor } from "./admin_edit.js";

export async function render(main) {
  if (!session.me.admin) {
    clear(main, pageTitle("Admin"), h("p", {}, "Only admins manage users, groups and failure rules."));
    return;
  }
  const usersBox = h("div");
  const userEdit = h("div", { id: "user-editor" });
  const groupsBox = h("div");
  const groupEdit = h("div", { id: "group-editor" });
  const storagesBox = h("div", { id: "storages-admin" });
  const rulesBox = h("div");
  const msg = h("div", { role: "status" });
  clear(main, pageTitle("Admin"), msg,
    h("section", { "aria-labelledby": "users-title" }, h("h2", { id: "users-title" }, "Users"), usersBox, userEdit),
    h("section", { "aria-labelledby": "groups-title" }, h("h2", { id: "groups-title" }, "Groups"), groupsBox, groupEdit),
    h("section", { "aria-labelledby": "storages-title" }, h("h2", { id: "storages-title" }, "Storages"),
      h("p", { class: "muted" }, "Where jobs keep data; a group's members may mount the storages it grants (docs/storage.md)."), storagesBox),
    h("section", { "aria-labelledby": "rules-title" }, h("h2", { id: "rules-title" }, "Failure rules"),
      h("p", { class: "muted" }, "Matched in order, first match wins (OpenPAI's exit spec). Changes apply at once, without a restart."), rulesBox));

  function say(text, bad = false) { clear(msg, bad ? errorBox(text) : h("div", { class: "ok-box" }, text)); announce(text); }

  async function loadUsers() {
    const users = await get("/api/v2/users");
    const name = h("input", { id: "nu-name", required: true, autocomplete: "off" });
    const pw = h("input", { id: "nu-password", type: "password", required: true, autocomplete: "new-password" });
    const email = h("input", { id: "nu-email", type: "email" });
    const adm = h("input", { id: "nu-admin", type: "checkbox" });
    clear(usersBox,
      h("div", { class: "table-wrap" }, table(["user", "email", "groups", "virtual clusters", "admin", ""], users.map((u) => h("tr", { dataset: { user: u.username } },
        h("th", { scope: "row" }, u.username), h("td", {}, u.email || ""), h("td", {}, u.grouplist.join(", ")),
        h("td", {}, (u.virtualCluster || []).join(", ")), h("td", {}, u.admin ? "yes" : "no"),
        h("td", {}, h("button", { type: "button", class: "small", "aria-label": `edit user ${u.username}`, onclick: async () => {
          userEditor(userEdit, u, await get("/api/v2/groups"), { say, done: loadUsers });
        } }, "Edit"), " ",
        u.username === session.me.username ? "" : h("button", { type: "button", class: "small danger", "aria-label": `delete user ${u.username}`, onclick: async () => {
          if (!confirm(`Delete user ${u.username}? Their tokens stop working.`)) return;
          try { await api("DELETE", `/api/v2/users/${encodeURIComponent(u.username)}`); say(`deleted ${u.username}`); await loadUsers(); } catch (err) { say(err.message, true); }
        } }, "Delete")))), { id: "users" })),
      h("form", { class: "filters", "aria-label": "Add a user", onsubmit: async (e) => {
        e.preventDefault();
        try {
          await api("POST", "/api/v2/users", { body: { username: name.value.trim(), password: pw.value, email: email.value.trim(), admin: adm.checked } });
          say(`added ${name.value.trim()}`); await loadUsers();
        } catch (err) { say(err.message, true); }
      } },
      h("div", { class: "field" }, h("label", { for: "nu-name" }, "New user"), name),
      h("div", { class: "field" }, h("label", { for: "nu-password" }, "Password"), pw),
      h("div", { class: "field" }, h("label", { for: "nu-email" }, "Email"), email),
      h("div", { class: "field" }, h("label", { for: "nu-admin" }, "Admin"), adm),
      h("div", { class: "field" }, h("span", { class: "label-spacer" }, " "), h("button", { type: "submit", class: "primary" }, "Add user"))));
  }

  async function loadGroups() {
    const groups = await get("/api/v2/groups");
    const edit = async (g) => {
      const [vcs, storages] = await Promise.all([get("/api/v2/virtual-clusters").catch(() => ({})), get("/api/v2/storages").catch(() => ({ storages: [] }))]);
      groupEditor(groupEdit, g, { vcs: Object.keys(vcs), storages: storages.storages.map((s) => s.name) }, { say, done: async () => { await loadGroups(); await loadStorages(); await loadUsers(); } });
    };
    clear(groupsBox, h("div", { class: "table-wrap" }, table(["group", "description", "external name", "admin", "virtual clusters", "storages",
      "priority classes (beyond test, oppo)", ""], groups.map((g) => {
      const acls = (g.extension && g.extension.acls) || {};
      return h("tr", { dataset: { group: g.groupname } }, h("th", { scope: "row" }, g.groupname), h("td", {}, g.description || ""),
        h("td", {}, g.externalName || ""),
        h("td", {}, acls.admin ? "yes" : "no"), h("td", { class: "vcs" }, (acls.virtualClusters || []).join(", ")),
        h("td", {}, (acls.storageConfigs || []).join(", ")),
        h("td", {}, acls.admin ? "all" : (acls.priorityClasses || []).join(", ")),
        h("td", {}, h("button", { type: "button", class: "small", "aria-label": `edit group ${g.groupname}`, onclick: () => edit(g) }, "Edit"), " ",
          ["admin", "default"].includes(g.groupname) ? "" : h("button", { type: "button", class: "small danger", "aria-label": `delete group ${g.groupname}`, onclick: async () => {
            if (!confirm(`Delete group ${g.groupname}?`)) return;
            try { await api("DELETE", `/api/v2/groups/${encodeURIComponent(g.groupname)}`); say(`deleted the group ${g.groupname}`); await loadGroups(); } catch (err) { say(err.message, true); }
          } }, "Delete")));
    }), { id: "groups" })),
      h("div", { class: "toolbar" }, h("button", { type: "button", id: "group-add", onclick: () => edit(null) }, "Add a group")));
  }

  async function loadStorages() { await storageSection(storagesBox, { say, done: async () => { await loadGroups(); await loadStorages(); } }); }

  async function loadRules() {
    const set = await get("/api/v2/rules");
    clear(rulesBox,
      h("div", { class: "toolbar" }, h("span", { class: "muted" }, `${set.rules.length} rules · revision ${set.revision ?? "–"}`),
        h("button", { type: "button", class: "danger", id: "rules-reset", onclick: async () => {
          if (!confirm("Reset the failure rules to the shipped defaults? Every change made here is lost.")) return;
          try { await api("POST", "/api/v2/rules/reset"); say("failure rules reset to the shipped defaults"); await loadRules(); } catch (err) { say(err.message, true); }
        } }, "Reset to defaults")),
      h("ol", { class: "rules", id: "rules" }, set.rules.map((rule) => {
        const text = h("textarea", { class: "code", rows: "10", spellcheck: "false", "aria-label": `rule ${rule.code} as JSON` }, JSON.stringify(rule, null, 2));
        const problems = h("ul", { class: "errors" });
        return h("li", {}, h("details", {},
          h("summary", {}, h("strong", {}, String(rule.code)), " ", rule.phrase || "", rule.reaction ? h("span", { class: "muted" }, ` · ${rule.reaction}`) : ""),
          text, problems,
          h("button", { type: "button", onclick: async () => {
            clear(problems);
            let parsed;
            try { parsed = JSON.parse(text.value); } catch (err) { problems.append(h("li", {}, `not JSON: ${err.message}`)); return; }
            try {
              await api("PUT", `/api/v2/rules/${rule.code}`, { body: parsed });
              say(`rule ${rule.code} saved`);
            } catch (err) {
              const list = (err.body && (err.body.problems || (err.body.details && (err.body.details.problems || err.body.details.errors)))) || [];
              problems.append(...(list.length ? list.map((p) => h("li", {}, h("code", {}, p.path || "$"), " ", p.message)) : [h("li", {}, err.message)]));
            }
          } }, `Save rule ${rule.code}`)));
      })));
  }
  await Promise.all([loadUsers(), loadGroups(), loadStorages(), loadRules()].map((p) => p.catch((err) => say(err.message, true))));
}
