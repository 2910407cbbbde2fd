// Sign in with a user name and password (a login token is issued), with a token, or
// through the organisation's identity provider where one is configured (OIDC: the
// browser goes there and comes back to / with the token, main.js takes it).

import { api, session } from "../api.js";
import { clear, h, pageTitle } from "../dom.js";
import { signedIn } from "../main.js";

export async function render(main, { params, go }) {
  const next = params.get("next") || "/";
  const error = h("div", { class: "error-box", role: "alert", hidden: true });
  const username = h("input", { id: "login-user", name: "username", autocomplete: "username", required: true });
  const password = h("input", { id: "login-password", name: "password", type: "password", autocomplete: "current-password", required: true });
  const token = h("input", { id: "login-token", name: "token", type: "password", autocomplete: "off", required: true });
  const remember = h("input", { id: "login-remember", type: "checkbox" });
  // Which sign-ins there are; an older PAI without /authn/info offers passwords.
  let info = { basicAuth: true, oidc: null };
  try { info = await api("GET", "/api/v2/authn/info", { token: "-" }); } catch { /* keep the password form */ }

  async function finish(tok) {
    session.save(tok, remember.checked);
    await signedIn();
    go(next === "/login" ? "/" : next);
  }
  function fail(err) {
    error.hidden = false;
    error.textContent = err.message || String(err);
  }
  const passwordForm = h("form", { class: "card stack", "aria-labelledby": "pw-title", onsubmit: async (e) => {
    e.preventDefault();
    error.hidden = true;
    try {
      const got = await api("POST", "/api/v2/authn/basic/login", { body: { username: username.value, password: password.value }, token: "-" });
      await finish(got.token);
    } catch (err) { fail(err); }
  } },
    h("h2", { id: "pw-title" }, "With your password"),
    h("label", { for: "login-user" }, "User name"), username,
    h("label", { for: "login-password" }, "Password"), password,
    h("button", { type: "submit", class: "primary" }, "Sign in"));
  const tokenForm = h("form", { class: "card stack", "aria-labelledby": "tok-title", onsubmit: async (e) => {
    e.preventDefault();
    error.hidden = true;
    try {
      await api("GET", "/api/v2/users/me", { token: token.value.trim() });
      await finish(token.value.trim());
    } catch (err) { fail(err.status === 401 ? new Error("That token is not valid: unknown, expired or revoked.") : err); }
  } },
    h("h2", { id: "tok-title" }, "With a token"),
    h("label", { for: "login-token" }, "Token"), token,
    h("p", { class: "hint" }, "An application token (", h("code", {}, "pai token create"), ") or the admin token printed by ", h("code", {}, "make up"), "."),
    h("button", { type: "submit" }, "Sign in with token"));
  const forms = [tokenForm];
  if (info.basicAuth !== false) forms.unshift(passwordForm);
  if (info.oidc) {
    const to = `${info.oidc.loginURI}?${new URLSearchParams({ from: next === "/login" ? "/" : next })}`;
    forms.unshift(h("div", { class: "card stack", "aria-labelledby": "oidc-title" },
      h("h2", { id: "oidc-title" }, "With your organisation's account"),
      h("a", { class: "button primary", id: "login-oidc", href: to }, `Sign in with ${info.oidc.provider}`)));
  }
  if (params.get("error")) { error.hidden = false; error.textContent = params.get("error"); }
  clear(main,
    h("div", { class: "login" },
      pageTitle("Sign in to PAI"),
      h("p", { class: "muted" }, "Run AI jobs on the shared GPU cluster."),
      error,
      h("div", { class: "login-forms" }, ...forms),
      h("p", {}, h("label", { class: "inline" }, remember, " Keep me signed in on this browser")),
      h("p", { class: "muted" }, "The API reference: ", h("a", { href: "/api/v2/docs" }, "/api/v2/docs"))));
  if (session.token) { try { await finish(session.token); } catch { session.forget(); } }
  (info.basicAuth !== false ? username : token).focus();
}
