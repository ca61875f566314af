// The device list, read once and then kept current from the event stream.
// Listeners are told at most every 150 ms, so a burst of events costs one
// render.
import { api, dev } from './api.js';

export class Devices {
  constructor(events) {
    this.map = new Map();
    this.reasons = new Map(); // why each device went offline, from its event
    this.listeners = new Set();
    this.loaded = false;
    this.timer = 0;
    events.subscribe((ev) => this.apply(ev));
    events.onReconnect(() => this.load().catch(() => {}));
  }
  listen(f) { this.listeners.add(f); return () => this.listeners.delete(f); }
  async load() {
    const r = await api('GET', '/api/v1/devices');
    this.map = new Map(r.devices.map((d) => [d.id, d]));
    this.loaded = true;
    this.changed();
  }
  list() { return [...this.map.values()]; }
  get(ref) {
    if (this.map.has(ref)) return this.map.get(ref);
    const r = String(ref).toLowerCase();
    for (const d of this.map.values()) if (d.alias === r || d.id.toLowerCase() === r) return d;
    return undefined;
  }
  async refresh(id) {
    try {
      const d = await api('GET', dev(id));
      this.map.set(d.id, d);
      this.changed();
    } catch {}
  }
  apply(ev) {
    const d = this.map.get(ev.device);
    const data = ev.data || {};
    switch (ev.type) {
      case 'device_online':
        this.reasons.delete(ev.device);
        if (!d) { this.refresh(ev.device); return; }
        Object.assign(d, { online: true, state: 'discovering', transport: data.transport, session_id: data.session_id, remote: data.remote, connected_at: ev.time, last_seen: ev.time });
        delete d.last_error;
        break;
      case 'device_state':
      case 'tools_changed':
        // Discovery ended: the device's catalog, firmware and error are new.
        this.refresh(ev.device);
        return;
      case 'alias_changed':
        if (d) d.alias = ev.alias;
        break;
      case 'device_offline':
        this.reasons.set(ev.device, data.reason || '');
        if (d) Object.assign(d, { online: false, state: 'offline', pending_calls: 0, queued_calls: 0 });
        break;
      case 'device_forgotten':
        this.map.delete(ev.device);
        break;
      case 'call_completed':
        if (d) d.last_seen = ev.time;
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
