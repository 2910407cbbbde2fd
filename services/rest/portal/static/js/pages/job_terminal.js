// The job page's terminal: a shell in one running task, for the job's owner and admins,
// over a WebSocket to rest (GET /api/v2/jobs/{id}/terminal; rest relays it to the task
// through the launcher, so the browser needs no route to the node). Drawn by xterm.js,
// vendored under /portal/vendor/xterm (MIT). A browser's WebSocket cannot carry an
// Authorization header, and a token in the URL would land in logs: the token goes as
// the subprotocol base64url.bearer.pai.<token>, beside pai.terminal.v1.

import { FitAddon } from "../../vendor/xterm/addon-fit.mjs";
import { Terminal } from "../../vendor/xterm/xterm.mjs";
import { jobPath, session } from "../api.js";
import { announce, h } from "../dom.js";

function base64url(text) {
  const bytes = new TextEncoder().encode(text);
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

// xterm.js writes its layout and colours into <style> elements it creates; the portal's
// CSP (style-src 'self': no inline styles) refuses those, loudly. While a terminal is
// open, a <style> made by script is made as an inert <pai-xterm-style> instead (hidden
// by portal.css), and its text goes into a constructed style sheet, which the CSP does
// not govern. No other script of the portal makes <style> elements (the CSP forbids them).
const STAND_IN = "pai-xterm-style";

function mirrorStyles(root) {
  document.createElement = function createElement(tag, options) {
    return Document.prototype.createElement.call(this, String(tag).toLowerCase() === "style" ? STAND_IN : tag, options);
  };
  const sheets = new Map();
  const sync = () => {
    for (const el of root.querySelectorAll(STAND_IN)) {
      let entry = sheets.get(el);
      if (!entry) {
        entry = { sheet: new CSSStyleSheet(), text: null };
        sheets.set(el, entry);
        document.adoptedStyleSheets = [...document.adoptedStyleSheets, entry.sheet];
      }
      if (entry.text !== el.textContent) { entry.text = el.textContent; entry.sheet.replaceSync(entry.text); }
    }
  };
  const observer = new MutationObserver(sync);
  observer.observe(root, { subtree: true, childList: true, characterData: true });
  return () => {
    delete document.createElement;  // Document.prototype's again
    observer.disconnect();
    const ours = new Set([...sheets.values()].map((e) => e.sheet));
    document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => !ours.has(s));
  };
}

export function terminalSection(id) {
  const title = h("h2", { id: "terminal-title" }, "Terminal");
  const status = h("span", { class: "muted", id: "terminal-status", role: "status" });
  const screen = h("div", { class: "terminal-screen", id: "terminal-screen" });
  const closeButton = h("button", { type: "button", class: "small", id: "terminal-close" }, "Close");
  const section = h("section", { id: "terminal", class: "terminal", "aria-labelledby": "terminal-title", hidden: true },
    title, h("div", { class: "toolbar" }, status, closeButton), screen);
  let current = null;  // {term, socket, unmirror, onResize, task}

  function close() {
    if (!current) return;
    const { term, socket, unmirror, onResize } = current;
    current = null;
    window.removeEventListener("resize", onResize);
    if (socket.readyState <= 1) socket.close(1000, "closed in the portal");
    term.dispose();
    unmirror();
    screen.replaceChildren();
    section.hidden = true;
  }
  closeButton.addEventListener("click", close);

  function open(role, index) {
    close();
    const task = `${role}[${index}]`;
    section.hidden = false;
    title.textContent = `Terminal: ${task}`;
    const unmirror = mirrorStyles(screen);
    const term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000 });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(screen);
    fit.fit();
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const query = `taskRole=${encodeURIComponent(role)}&taskIndex=${index}&cols=${term.cols}&rows=${term.rows}`;
    const socket = new WebSocket(`${scheme}://${location.host}${jobPath(id)}/terminal?${query}`,
      ["pai.terminal.v1", `base64url.bearer.pai.${base64url(session.token || "")}`]);
    socket.binaryType = "arraybuffer";
    const onResize = () => fit.fit();
    current = { term, socket, unmirror, onResize };
    window.addEventListener("resize", onResize);
    let ended = "";
    status.textContent = `connecting to ${task}…`;
    socket.onopen = () => { status.textContent = `connected to ${task}`; announce(`Terminal open in ${task}`); term.focus(); };
    socket.onmessage = (ev) => {
      if (typeof ev.data !== "string") { term.write(new Uint8Array(ev.data)); return; }
      try { const said = JSON.parse(ev.data); if (said.closed) ended = said.closed; } catch { /* not for us */ }
    };
    socket.onclose = (ev) => {
      status.textContent = ended ? `closed: ${ended}`
        : ev.code === 1006 ? `could not connect to ${task}: it may have ended, or you may not open it`
          : `closed${ev.reason ? `: ${ev.reason}` : ""}`;
      announce(status.textContent);
    };
    const encoder = new TextEncoder();
    term.onData((data) => { if (socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(data)); });
    term.onResize(({ cols, rows }) => {
      if (socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ resize: { cols, rows } }));
    });
    section.scrollIntoView({ block: "nearest" });
  }

  return { section, open, close };
}
