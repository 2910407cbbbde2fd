// The signed-in user's own page: who they are, and their SSH public keys (GET, POST,
// DELETE /api/v2/users/me/ssh-keys), which the tasks of jobs with the ssh plugin trust;
// their email, password, notification settings, tokens, groups, VCs and storages
// (js/pages/profile_account.js).

import { api, get, session } from "../api.js";
import { announce, clear, errorBox, fmtTime, h, pageTitle, table } from "../dom.js";
import { accountSections } from "./profile_account.js";

export async function render(main) {
  const me = session.me;
  const keysBox = h("div", { id: "ssh-keys" });
  const msg = h("div", { role: "status" });
  const title = h("input", { id: "key-title", required: true, autocomplete: "off", maxlength: "64", placeholder: "laptop" });
  const value = h("textarea", { id: "key-value", required: true, rows: "3", cols: "70", spellcheck: "false",
    placeholder: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA… me@laptop" });

  function say(text, bad = false) { clear(msg, bad ? errorBox(text) : h("div", { class: "ok-box" }, text)); announce(text); }

  async function remove(key) {
    if (!confirm(`Delete the SSH key ${key.title}? Jobs submitted from now on stop trusting it.`)) return;
    try {
      await api("DELETE", `/api/v2/users/me/ssh-keys/${encodeURIComponent(key.title)}`);
      say(`deleted the key ${key.title}`);
      await load();
    } catch (err) { say(err.message, true); }
  }

  async function load() {
    const { sshKeys } = await get("/api/v2/users/me/ssh-keys");
    clear(keysBox, sshKeys.length
      ? h("div", { class: "table-wrap" }, table(["title", "key", "added", ""], sshKeys.map((k) => {
        const [type, body = "", ...comment] = k.value.split(/\s+/);
        const shown = `${type} …${body.slice(-12)}${comment.length ? " " + comment.join(" ") : ""}`;
        return h("tr", { dataset: { key: k.title } },
          h("th", { scope: "row" }, k.title), h("td", {}, h("code", { title: k.value }, shown)), h("td", {}, fmtTime(k.time)),
          h("td", {}, h("button", { type: "button", class: "small danger", "aria-label": `delete key ${k.title}`, onclick: () => remove(k) }, "Delete")));
      }), { id: "ssh-key-list" }))
      : h("p", { class: "muted", id: "no-ssh-keys" }, "No SSH key yet."));
  }

  async function add(e) {
    e.preventDefault();
    try {
      await api("POST", "/api/v2/users/me/ssh-keys", { body: { title: title.value.trim(), value: value.value.trim() } });
      say(`added the key ${title.value.trim()}`);
      title.value = ""; value.value = "";
      await load();
    } catch (err) { say(err.message, true); }
  }

  const account = accountSections(me);
  clear(main, pageTitle(me.username),
    h("p", { class: "muted" }, `${me.email || "no email"} · groups ${me.grouplist.join(", ") || "none"} · VCs ${(me.virtualCluster || []).join(", ") || "none"}`,
      me.admin ? " · admin" : ""),
    h("nav", { "aria-label": "On this page", class: "toolbar" }, [["account-title", "Email and password"], ["notify-title", "Notifications"],
      ["tokens-title", "Tokens"], ["keys-title", "SSH keys"], ["access-title", "Groups, VCs and storages"]].map(([id, text]) => h("a", { href: `#/profile`, dataset: { to: id }, onclick: (e) => {
      e.preventDefault(); const t = document.getElementById(id); t.scrollIntoView(); t.focus(); } }, text))),
    account.top,
    h("section", { "aria-labelledby": "keys-title" }, h("h2", { id: "keys-title" }, "SSH keys"),
      h("p", { class: "muted" }, "The tasks of a job that asks for the ssh plugin accept these keys, as they were when the job was submitted."),
      msg, keysBox,
      h("form", { class: "filters", "aria-label": "Add an SSH key", onsubmit: add },
        h("div", { class: "field" }, h("label", { for: "key-title" }, "Title"), title),
        h("div", { class: "field" }, h("label", { for: "key-value" }, "Public key"), value),
        h("div", { class: "field" }, h("span", { class: "label-spacer" }, " "), h("button", { type: "submit", class: "primary" }, "Add key")))),
    account.bottom);
  await Promise.all([load(), account.load()]);
}
