// The profile page's account sections: email and password (PUT /api/v2/users/me), the
// default for job status mail (extension.jobStatusChangeNotification, which a submission
// that does not say follows), tokens (GET, POST, DELETE /api/v2/tokens), and what the
// user's groups give them: VCs, priority classes, storages they can mount.

import { api, get, session } from "../api.js";
import { announce, clear, errorBox, fmtTime, h, table } from "../dom.js";

export const NOTIFY_STATES = ["running", "succeeded", "failed", "stopped", "retried", "waiting"];
const DAY = 86400;

function section(id, title, ...kids) {
  return h("section", { "aria-labelledby": id }, h("h2", { id, tabindex: "-1" }, title), ...kids);
}
function field(label, control) { return h("div", { class: "field" }, h("label", { for: control.id }, label), control); }

export function accountSections(me) {
  const msg = h("div", { role: "status", id: "account-msg" });
  const say = (text, bad = false) => { clear(msg, bad ? errorBox(text) : h("div", { class: "ok-box" }, text)); announce(text); };

  // --- email and password ---------------------------------------------------------------
  const email = h("input", { id: "me-email", type: "email", value: me.email || "", size: "30", autocomplete: "email" });
  const oldPw = h("input", { id: "pw-old", type: "password", autocomplete: "current-password", required: true });
  const newPw = h("input", { id: "pw-new", type: "password", autocomplete: "new-password", required: true });
  const again = h("input", { id: "pw-again", type: "password", autocomplete: "new-password", required: true });
  const account = section("account-title", "Email and password", msg,
    h("form", { class: "filters", "aria-label": "Change your email", onsubmit: async (e) => {
      e.preventDefault();
      try { session.me = await api("PUT", "/api/v2/users/me", { body: { email: email.value.trim() } }); say(`your email is now ${session.me.email || "none"}`); } catch (err) { say(err.message, true); }
    } }, field("Email", email), h("div", { class: "field" }, h("span", { class: "label-spacer" }, " "), h("button", { type: "submit" }, "Save email"))),
    me.hasPassword === false
      ? h("p", { class: "muted" }, "You sign in through your organisation's identity provider: PAI keeps no password for you.")
      : h("form", { class: "filters", "aria-label": "Change your password", onsubmit: async (e) => {
        e.preventDefault();
        if (newPw.value !== again.value) { say("the new password and its repetition differ", true); return; }
        try {
          await api("PUT", "/api/v2/users/me", { body: { password: newPw.value, oldPassword: oldPw.value } });
          oldPw.value = newPw.value = again.value = "";
          say("password changed; your other sign-ins have ended (this one and application tokens go on)");
        } catch (err) { say(err.message, true); }
      } }, field("Current password", oldPw), field("New password", newPw), field("New password again", again),
      h("div", { class: "field" }, h("span", { class: "label-spacer" }, " "), h("button", { type: "submit" }, "Change password"))));

  // --- notifications --------------------------------------------------------------------
  const setting = (me.extension || {}).jobStatusChangeNotification;
  const chosen = setting === true ? new Set(["running", "succeeded", "failed", "stopped", "retried"])
    : new Set(Object.entries(setting && typeof setting === "object" ? setting : {}).filter(([, v]) => v).map(([k]) => k.toLowerCase()));
  const wants = h("input", { type: "checkbox", id: "notify-on", checked: Boolean(setting) && chosen.size > 0 });
  const states = NOTIFY_STATES.map((s) => {
    const box = h("input", { type: "checkbox", id: `notify-${s}`, value: s, checked: chosen.has(s) });
    return h("label", { class: "inline", for: box.id }, box, s);
  });
  const notify = section("notify-title", "Notifications",
    h("p", { class: "muted" }, "Mail to ", me.email ? h("strong", {}, me.email) : "your email (none set yet)",
      " when one of your jobs changes state: the default for jobs that do not say (a job's own ", h("code", {}, "extras.jobStatusChangeNotification"), " wins)."),
    h("form", { "aria-label": "Notification settings", onsubmit: async (e) => {
      e.preventDefault();
      const picked = states.map((l) => l.querySelector("input")).filter((b) => b.checked).map((b) => b.value);
      const value = wants.checked && picked.length ? Object.fromEntries(picked.map((s) => [s, true])) : false;
      try {
        await api("PUT", `/api/v2/users/${encodeURIComponent(me.username)}/extension`, { body: { extension: { jobStatusChangeNotification: value } } });
        session.me = await get("/api/v2/users/me");
        say(value ? `you will get mail when your jobs are ${picked.join(", ")}` : "no mail about your jobs unless a job asks for it");
      } catch (err) { say(err.message, true); }
    } },
    h("label", { class: "inline", for: "notify-on" }, wants, "Mail me about my jobs"),
    h("fieldset", { class: "checks" }, h("legend", {}, "when they are"), h("div", { class: "filters" }, states)),
    h("div", { class: "toolbar" }, h("button", { type: "submit" }, "Save notifications"))));

  // --- tokens ---------------------------------------------------------------------------
  const tokenList = h("div", { id: "tokens" });
  const fresh = h("div", { id: "new-token", role: "status" });
  const description = h("input", { id: "token-description", size: "24", maxlength: "256", autocomplete: "off", placeholder: "ci" });
  const lifetime = h("select", { id: "token-days" }, [1, 7, 30, 90].map((d) => h("option", { value: String(d), selected: d === 30 }, `${d} day${d > 1 ? "s" : ""}`)));
  async function loadTokens() {
    const { tokens } = await get("/api/v2/tokens");
    clear(tokenList, tokens.length ? h("div", { class: "table-wrap" }, table(["description", "kind", "created", "expires", ""], tokens.map((t) =>
      h("tr", { dataset: { token: t.id } }, h("th", { scope: "row" }, t.description || "–"), h("td", {}, t.kind), h("td", {}, fmtTime(t.createdTime)),
        h("td", {}, t.expiresTime ? fmtTime(t.expiresTime) : "never"),
        h("td", {}, h("button", { type: "button", class: "small danger", "aria-label": `revoke token ${t.description || t.id}`, onclick: async () => {
          if (!confirm(`Revoke the token ${t.description || t.id}? Whatever uses it stops working (if it is this sign-in, you are signed out).`)) return;
          try { await api("DELETE", `/api/v2/tokens/${encodeURIComponent(t.id)}`); say(`revoked the token ${t.description || t.id}`); await loadTokens(); } catch (err) { say(err.message, true); }
        } }, "Revoke")))), { id: "token-list" })) : h("p", { class: "muted" }, "No token."));
  }
  const tokens = section("tokens-title", "Tokens",
    h("p", { class: "muted" }, "Each sign-in is a token; an application token is for a script or the ", h("code", {}, "pai"), " command (",
      h("code", {}, "Authorization: Bearer <token>"), "). PAI keeps only a hash: a new token is shown once."),
    h("form", { class: "filters", "aria-label": "Create a token", onsubmit: async (e) => {
      e.preventDefault();
      try {
        const got = await api("POST", "/api/v2/tokens", { body: { description: description.value.trim(), expiration: Number(lifetime.value) * DAY } });
        const shown = h("code", { id: "new-token-value", class: "token-once" }, got.token);
        clear(fresh, h("div", { class: "ok-box" }, "Your new token (copy it now; it is not shown again): ", shown, " ",
          h("button", { type: "button", class: "small", onclick: () => navigator.clipboard && navigator.clipboard.writeText(got.token) }, "Copy")));
        description.value = "";
        announce("token created; copy it now");
        await loadTokens();
      } catch (err) { say(err.message, true); }
    } }, field("Description", description), field("Expires after", lifetime),
    h("div", { class: "field" }, h("span", { class: "label-spacer" }, " "), h("button", { type: "submit", class: "primary" }, "Create token"))),
    fresh, tokenList);

  // --- groups, VCs, storages ------------------------------------------------------------
  const access = h("div", { id: "access" });
  async function loadAccess() {
    const [groups, { storages }] = await Promise.all([
      Promise.all(me.grouplist.map((g) => get(`/api/v2/groups/${encodeURIComponent(g)}`).catch(() => ({ groupname: g })))),
      get("/api/v2/storages").catch(() => ({ storages: [] }))]);
    clear(access,
      h("h3", {}, "Groups"),
      h("div", { class: "table-wrap" }, table(["group", "description", "virtual clusters", "storages"], groups.map((g) => {
        const acls = (g.extension && g.extension.acls) || {};
        return h("tr", {}, h("th", { scope: "row" }, g.groupname), h("td", {}, g.description || ""),
          h("td", {}, acls.admin ? "all (admin)" : (acls.virtualClusters || []).join(", ")), h("td", {}, (acls.storageConfigs || []).join(", ")));
      }), { id: "my-groups" })),
      h("p", {}, "Your virtual clusters: ", h("strong", { id: "my-vcs" }, (me.virtualCluster || []).join(", ") || "none"),
        " · priority classes: ", (me.priorityClasses || []).join(", ")),
      h("h3", {}, "Storages you can mount"),
      storages.length ? h("div", { class: "table-wrap" }, table(["storage", "type", "mounted at", "read-only", "default"], storages.map((s) =>
        h("tr", {}, h("th", { scope: "row" }, s.name), h("td", {}, s.type), h("td", {}, h("code", {}, s.mountPath)),
          h("td", {}, s.readOnly ? "yes" : "no"), h("td", {}, s.default ? "yes" : "no"))), { id: "my-storages" }))
        : h("p", { class: "muted", id: "my-storages" }, "None: an admin grants storages to groups."),
      h("p", { class: "hint" }, "Mount one with the teamwise_storage plugin, or tick it in the submit page's form."));
  }

  return {
    top: [account, notify, tokens],
    bottom: section("access-title", "Groups, VCs and storages", access),
    load: () => Promise.all([loadTokens(), loadAccess()]),
  };
}
