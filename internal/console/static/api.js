// The REST API as the console uses it: every request carries the key kept
// for this tab (sessionStorage), and a 401 anywhere sends the user back to
// sign-in.

import { parseExact } from './json.js';

const KEY = 'mcpgate.key';

export const key = {
  get: () => sessionStorage.getItem(KEY) || '',
  set: (k) => (k ? sessionStorage.setItem(KEY, k) : sessionStorage.removeItem(KEY)),
};

export class APIError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

let unauthorized = () => {};
export function onUnauthorized(f) { unauthorized = f; }

function headers(extra) {
  const h = { ...extra };
  const k = key.get();
  if (k) h.Authorization = 'Bearer ' + k;
  return h;
}

async function fail(r) {
  const text = await r.text();
  let e;
  try {
    const b = JSON.parse(text);
    e = new APIError(r.status, b.error.code, b.error.message, b.error.details);
  } catch {
    e = new APIError(r.status, '', text.slice(0, 300) || r.statusText);
  }
  if (r.status === 401) unauthorized(e);
  return e;
}

// send fetches path; a failure to reach the gateway at all (it is down, or
// the network is) becomes an APIError that says so, not the browser's bare
// "Failed to fetch".
async function send(path, init) {
  try {
    return await fetch(path, init);
  } catch (e) {
    if (init.signal?.aborted) throw e;
    throw new APIError(0, 'unreachable', `Cannot reach the gateway at ${location.host} (${e.message}): is it running?`);
  }
}

// api sends a JSON request and returns the decoded answer; exact keeps
// integers beyond 2^53 as written (json.js), for answers shown as they are.
export async function api(method, path, body, { exact = false } = {}) {
  const init = { method, headers: headers(body === undefined ? {} : { 'Content-Type': 'application/json' }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const r = await send(path, init);
  if (!r.ok) throw await fail(r);
  const text = await r.text();
  if (!text) return null;
  return exact ? parseExact(text) : JSON.parse(text);
}

// raw fetches a path with the key and returns the Response (metrics, photos).
export async function raw(path) {
  const r = await send(path, { headers: headers() });
  if (!r.ok) throw await fail(r);
  return r;
}

export const dev = (ref) => '/api/v1/devices/' + encodeURIComponent(ref);

// Events reads GET /api/v1/events with fetch (EventSource cannot send the
// key) and hands each event to every subscriber; it reconnects after a
// failure, and stops for good on a 401.
export class Events {
  constructor() {
    this.subs = new Set();
    this.stateSubs = new Set();
    this.live = false;
    this.ctrl = null;
  }
  subscribe(f) { this.subs.add(f); return () => this.subs.delete(f); }
  onState(f) { this.stateSubs.add(f); f(this.live); return () => this.stateSubs.delete(f); }
  setLive(v) { this.live = v; for (const f of this.stateSubs) f(v); }
  start() {
    if (this.ctrl) return;
    this.ctrl = new AbortController();
    this.loop(this.ctrl.signal);
  }
  stop() { if (this.ctrl) this.ctrl.abort(); this.ctrl = null; this.setLive(false); }
  async loop(signal) {
    while (!signal.aborted) {
      try {
        const r = await fetch('/api/v1/events', { headers: headers({ Accept: 'text/event-stream' }), signal });
        if (!r.ok) {
          const e = await fail(r);
          if (e.status === 401) return;
          throw e;
        }
        this.setLive(true);
        for (const f of this.reconnectSubs || []) f();
        await this.read(r.body.getReader(), signal);
      } catch (e) {
        if (signal.aborted) return;
      }
      this.setLive(false);
      await new Promise((res) => setTimeout(res, 2000));
    }
  }
  async read(reader, signal) {
    const dec = new TextDecoder();
    let buf = '';
    while (!signal.aborted) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = block.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart()).join('\n');
        if (!data) continue;
        let ev;
        try { ev = parseExact(data); } catch { continue; }
        for (const f of this.subs) f(ev);
      }
    }
  }
  // onReconnect runs f each time the stream (re)opens: events were missed,
  // so lists must be read again.
  onReconnect(f) { (this.reconnectSubs ||= new Set()).add(f); return () => this.reconnectSubs.delete(f); }
}
