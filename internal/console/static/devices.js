// The device list, read once and then kept current from the event stream.
// Listeners are told at most every 150 ms, so a burst of events costs one
// render.
//
// Events carry only what changed; when a device needs its whole object
// again (new to the page, or its discovery ended), it is read again. Those
// reads are batched (100 ms; more than 20 devices: the whole list once),
// and a read is applied only if no event about the device came while it
// was in flight (otherwise it is read again), so an answer that raced an
// event never undoes it.
import { api, dev } from './api.js';
import { app } from './app.js';

export class Devices {
  constructor(events) {
    this.map = new Map();
    this.reasons = new Map(); // why each device went offline, from its event
    this.version = new Map(); // id → events applied, to spot stale reads
    this.stale = new Set(); // ids to read again at the next flush
    this.listeners = new Set();
    this.loaded = false;
    this.timer = 0;
    this.flushTimer = 0;
    this.buffer = null; // events that came while the whole list was being read
    this.nodes = false; // a device or an event named a cluster node: the pages show nodes
    this.gen = 0; // bumped by reset: reads started before it are dropped
    this.loading = null; // the whole list's read in flight
    this.again = false; // another read of the whole list is due after it
    events.subscribe((ev) => this.apply(ev));
    events.onReconnect(() => this.load().catch(() => {}));
  }
  listen(f) { this.listeners.add(f); return () => this.listeners.delete(f); }
  // reset forgets every device, for another key's session: what the last
  // one saw must not show, even from a read still in flight.
  reset() {
    this.gen++;
    this.map = new Map();
    this.reasons.clear();
    this.version.clear();
    this.stale.clear();
    this.loaded = false;
    this.nodes = false;
    this.changed();
  }
  // load reads the whole list. Reads never overlap: one asked for while
  // another runs follows it (two at once lost the events between them).
  load() {
    if (this.loading) {
      this.again = true;
      return this.loading;
    }
    this.loading = (async () => {
      try {
        do {
          this.again = false;
          await this.loadOnce();
        } while (this.again);
      } finally {
        this.loading = null;
      }
    })();
    return this.loading;
  }
  async loadOnce() {
    const gen = this.gen;
    this.buffer = [];
    try {
      const r = await api('GET', '/api/v1/devices');
      if (gen !== this.gen) return;
      if (!this.loaded) app.stats.listedMs = performance.now();
      this.map = new Map(r.devices.map((d) => [d.id, d]));
      if (r.devices.some((d) => d.node)) this.nodes = true;
      this.loaded = true;
      const missed = this.buffer;
      this.buffer = null;
      for (const ev of missed) this.apply(ev);
      this.changed();
    } finally {
      this.buffer = null;
    }
  }
  list() { return [...this.map.values()]; }
  get(ref) {
    if (this.map.has(ref)) return this.map.get(ref);
    const r = String(ref).toLowerCase();
    for (const d of this.map.values()) if (d.alias === r || d.id.toLowerCase() === r) return d;
    return undefined;
  }
  refresh(id) {
    this.stale.add(id);
    if (!this.flushTimer) this.flushTimer = setTimeout(() => this.flush(), 100);
  }
  flush() {
    this.flushTimer = 0;
    const ids = [...this.stale];
    this.stale.clear();
    if (ids.length > 20) { this.load().catch(() => {}); return; }
    for (const id of ids) this.readOne(id);
  }
  async readOne(id) {
    const v = this.version.get(id) || 0;
    const gen = this.gen;
    let d;
    try {
      d = await api('GET', dev(id));
    } catch (e) {
      if (gen !== this.gen) return;
      if (e.status === 404 && (this.version.get(id) || 0) === v) { this.map.delete(id); this.changed(); }
      return;
    }
    if (gen !== this.gen) return;
    if ((this.version.get(id) || 0) !== v) { this.refresh(id); return; }
    if (d.node) this.nodes = true;
    this.map.set(d.id, d);
    this.changed();
  }
  apply(ev) {
    if (this.buffer) this.buffer.push(ev);
    if (ev.node) this.nodes = true;
    this.version.set(ev.device, (this.version.get(ev.device) || 0) + 1);
    const d = this.map.get(ev.device);
    const data = ev.data || {};
    if (ev.type === 'device_offline') this.reasons.set(ev.device, data.reason || '');
    if (ev.type === 'device_online') this.reasons.delete(ev.device);
    if (!d) {
      if (ev.type !== 'device_forgotten') this.refresh(ev.device);
      return;
    }
    switch (ev.type) {
      case 'device_online':
        Object.assign(d, { online: true, state: 'discovering', transport: data.transport, session_id: data.session_id, remote: data.remote, connected_at: ev.time, last_seen: ev.time });
        delete d.last_error;
        if (ev.node) d.node = ev.node; // where it connected, in a cluster
        break;
      case 'device_state':
      case 'tools_changed':
        // Discovery ended: the device's catalog, firmware and error are new.
        if (data.state) d.state = data.state;
        this.refresh(ev.device);
        break;
      case 'alias_changed':
        d.alias = ev.alias;
        break;
      case 'device_offline':
        Object.assign(d, { online: false, state: 'offline', pending_calls: 0, queued_calls: 0, last_seen: ev.time });
        delete d.node; // an offline device is on no node
        break;
      case 'device_forgotten':
        this.map.delete(ev.device);
        break;
      case 'call_completed':
        d.last_seen = ev.time;
        break;
      default:
        return;
    }
    this.changed();
  }
  changed() {
    if (this.timer) return;
    this.timer = setTimeout(() => {
      this.timer = 0;
      for (const f of this.listeners) f();
    }, 150);
  }
}
