// The portal's only way to the API: every call carries the bearer token; errors come
// back as ApiError with the API's {code, message, errors}.

const TOKEN_KEY = "pai.token";

export class ApiError extends Error {
  constructor(status, body) {
    super(body && body.message ? body.message : `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
  }
}

export const session = {
  get token() { return sessionStorage.getItem(TOKEN_KEY) || localStorage.getItem(TOKEN_KEY); },
  save(token, remember) {
    this.forget();
    (remember ? localStorage : sessionStorage).setItem(TOKEN_KEY, token);
  },
  forget() { sessionStorage.removeItem(TOKEN_KEY); localStorage.removeItem(TOKEN_KEY); },
  me: null,
};

let onUnauthorized = () => {};
export function whenUnauthorized(fn) { onUnauthorized = fn; }

export async function api(method, path, { body, contentType, accept, raw, token } = {}) {
  const headers = {};
  const bearer = token || session.token;
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (accept) headers.Accept = accept;
  let payload;
  if (body !== undefined) {
    if (typeof body === "string") { payload = body; headers["Content-Type"] = contentType || "text/yaml"; }
    else { payload = JSON.stringify(body); headers["Content-Type"] = "application/json"; }
  }
  const res = await fetch(path, { method, headers, body: payload });
  if (!res.ok) {
    let data = null;
    try { data = await res.json(); } catch { data = { message: `${res.status} ${res.statusText}` }; }
    if (res.status === 401 && !token) onUnauthorized();
    throw new ApiError(res.status, data);
  }
  if (raw) return res;
  const type = res.headers.get("Content-Type") || "";
  return type.includes("json") ? res.json() : res.text();
}

export const get = (path, opts) => api("GET", path, opts);

// Job state changes, live. EventSource cannot send an Authorization header, and a
// token in the URL would land in access logs and browser history; so the stream is
// read with fetch, which sends the header, and parsed here. A dropped connection
// resumes after the last event seen (Last-Event-ID): nothing missed, nothing twice.
export class EventStream {
  constructor() {
    this.listeners = new Set();
    this.lastId = null;
    this.controller = null;
    this.connected = false;
    this.onstatus = () => {};
  }

  subscribe(fn) { this.listeners.add(fn); return () => this.listeners.delete(fn); }

  start() {
    if (this.controller) return;
    this.controller = new AbortController();
    this._loop(this.controller.signal);
  }

  stop() {
    if (this.controller) this.controller.abort();
    this.controller = null;
    this._status(false);
  }

  _status(up) { if (up !== this.connected) { this.connected = up; this.onstatus(up); } }

  async _loop(signal) {
    let delay = 1000;
    while (!signal.aborted) {
      try {
        const headers = { Authorization: `Bearer ${session.token}`, Accept: "text/event-stream" };
        if (this.lastId !== null) headers["Last-Event-ID"] = this.lastId;
        const res = await fetch("/api/v2/events", { headers, signal });
        if (res.status === 401) { this._status(false); return; }
        if (!res.ok || !res.body) throw new Error(`events: HTTP ${res.status}`);
        this._status(true);
        delay = 1000;
        await this._read(res.body.getReader(), signal);
      } catch (err) {
        if (signal.aborted) return;
      }
      this._status(false);
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 10000);
    }
  }

  async _read(reader, signal) {
    const decoder = new TextDecoder();
    let buffer = "";
    while (!signal.aborted) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        this._dispatch(block);
      }
    }
  }

  _dispatch(block) {
    let id = null, type = "message", data = "";
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "id") id = value;
      else if (field === "event") type = value;
      else if (field === "data") data += (data ? "\n" : "") + value;
    }
    if (id !== null) this.lastId = id;
    if (type !== "job.state" || !data) return;
    let event;
    try { event = JSON.parse(data); } catch { return; }
    for (const fn of this.listeners) { try { fn(event); } catch (e) { console.error(e); } }
  }
}

export const events = new EventStream();

export function jobPath(id) { return `/api/v2/jobs/${encodeURIComponent(id)}`; }

// Download a text answer as a file (the token travels in a header, so a plain link cannot).
export async function download(path, filename) {
  const res = await api("GET", path, { raw: true });
  const blob = await res.blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url; a.download = filename;
  document.body.append(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 5000);
}
