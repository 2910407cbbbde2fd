// The portal's shell: sign-in state, the top bar, the hash router, the theme.

import { api, events, session, whenUnauthorized } from "./api.js";
import { announce, clear, errorBox, h } from "./dom.js";
import * as login from "./pages/login.js";
import * as home from "./pages/home.js";
import * as jobs from "./pages/jobs.js";
import * as job from "./pages/job.js";
import * as submit from "./pages/submit.js";
import * as vcs from "./pages/vcs.js";
import * as cluster from "./pages/cluster.js";
import * as alerts from "./pages/alerts.js";
import * as admin from "./pages/admin.js";
import * as profile from "./pages/profile.js";
import * as market from "./pages/market.js";
import * as marketItem from "./pages/market_item.js";
import * as marketEdit from "./pages/market_edit.js";
import * as marketReview from "./pages/market_review.js";

const main = document.getElementById("main");
let leave = null; // the current page's clean-up (timers, event subscriptions)

// Route table: first pattern that matches the hash path wins.
const ROUTES = [
  [/^\/login$/, login],
  [/^\/$/, home],
  [/^\/jobs$/, jobs],
  [/^\/jobs\/(.+)$/, job],
  [/^\/submit$/, submit],
  [/^\/vcs(?:\/(.+))?$/, vcs],
  [/^\/cluster$/, cluster],
  [/^\/alerts$/, alerts],
  [/^\/admin$/, admin],
  [/^\/profile$/, profile],
  [/^\/market$/, market],
  [/^\/market\/item\/(.+)$/, marketItem],
  [/^\/market\/new$/, marketEdit],
  [/^\/market\/edit\/(.+)$/, marketEdit],
  [/^\/market\/review$/, marketReview],
];

export function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, query = ""] = raw.split("?");
  return { path, params: new URLSearchParams(query) };
}

export function go(path) { location.hash = `#${path}`; }

async function loadMe() {
  session.me = await api("GET", "/api/v2/users/me");
  showUser();
  events.start();
}

function showUser() {
  const me = session.me;
  document.getElementById("topbar").hidden = !me;
  if (!me) return;
  document.getElementById("who-name").textContent = me.username;
  document.getElementById("who-role").hidden = !me.admin;
  const vcsList = me.virtualCluster || [];
  document.getElementById("who-vcs").textContent = vcsList.length ? `VCs: ${vcsList.join(", ")}` : "no VC";
  document.getElementById("nav-admin").hidden = !me.admin;
}

async function route() {
  if (leave) { try { leave(); } catch (e) { console.error(e); } leave = null; }
  const { path, params } = parseHash();
  if (!session.token && path !== "/login") { go(`/login?next=${encodeURIComponent(path)}`); return; }
  if (session.token && !session.me && path !== "/login") {
    try { await loadMe(); } catch (err) {
      if (err.status === 401) { session.forget(); go("/login"); return; }
      clear(main, errorBox(err)); return;
    }
  }
  for (const a of document.querySelectorAll("#nav a")) {
    const target = a.getAttribute("href").slice(1);
    const current = target === "/" ? path === "/" : path === target || path.startsWith(target + "/");
    if (current) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  for (const [pattern, page] of ROUTES) {
    const m = path.match(pattern);
    if (!m) continue;
    clear(main, h("p", { class: "muted" }, "Loading…"));
    try {
      leave = (await page.render(main, { args: m.slice(1).map((x) => x && decodeURIComponent(x)), params, go })) || null;
    } catch (err) {
      clear(main, errorBox(err));
    }
    const title = document.getElementById("page-title");
    if (title) { title.focus({ preventScroll: true }); announce(title.textContent); }
    return;
  }
  clear(main, h("h1", { tabindex: "-1", id: "page-title" }, "Not found"), h("p", {}, `No page ${path}. `, h("a", { href: "#/" }, "Home")));
}

export async function signedIn() {
  session.me = null;
  await loadMe();
}

async function signOut() {
  try { await api("DELETE", "/api/v2/authn/basic/logout"); } catch { /* the token may be gone already */ }
  events.stop();
  session.forget();
  session.me = null;
  showUser();
  go("/login");
}

function setupTheme() {
  const button = document.getElementById("theme");
  const label = () => {
    const dark = document.documentElement.dataset.theme === "dark";
    button.setAttribute("aria-label", dark ? "Switch to light theme" : "Switch to dark theme");
    button.title = button.getAttribute("aria-label");
  };
  label();
  button.addEventListener("click", () => {
    const next = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
    document.documentElement.dataset.theme = next;
    localStorage.setItem("pai.theme", next);
    label();
  });
}

events.onstatus = (up) => {
  const dot = document.getElementById("live");
  dot.classList.toggle("on", up);
  dot.setAttribute("aria-label", `live updates: ${up ? "on" : "reconnecting"}`);
  dot.title = up ? "Live updates on" : "Live updates reconnecting";
};

whenUnauthorized(() => {
  events.stop();
  session.forget();
  session.me = null;
  showUser();
  go("/login");
});

// Back from the identity provider (OpenPAI's landing: /?user=&token=&admin=&from=): keep
// the token for this tab and take it out of the address bar and the history.
function tokenFromLanding() {
  const q = new URLSearchParams(location.search);
  if (!q.get("token")) return;
  session.save(q.get("token"), false);
  const from = q.get("from");
  history.replaceState(null, "", location.pathname + (from && from.startsWith("/") ? `#${from}` : location.hash));
}

tokenFromLanding();
document.getElementById("logout").addEventListener("click", signOut);
setupTheme();
window.addEventListener("hashchange", route);
route();
