// The console's pages. Each takes the <main> element and the route's
// arguments, renders, and returns a cleanup function (or nothing).
import { api, raw, dev, APIError } from './api.js';
import { h, ago, when, copy } from './dom.js';
import { schemaForm, jsonForm } from './form.js';
import { renderResult, renderError } from './result.js';
import { app, setView } from './app.js';

const PAGE = 100; // rows per page of the device table

function live(root) {
  const el = h('span', { class: 'live off', 'aria-live': 'polite' });
  const off = app.events.onState((on) => { el.className = 'live ' + (on ? 'on' : 'off'); el.textContent = on ? 'live' : 'reconnecting'; });
  root.append(el);
  return off;
}

function statePill(d) {
  return h('span', { class: 'pill ' + d.state, text: d.state });
}

// lastSeen is "now" while a device is connected (its last_seen moves only
// when it sends something), else how long ago its connection closed.
function lastSeen(d) { return d.online ? 'now' : ago(d.last_seen); }

function firmware(d) {
  return d.server_info ? `${d.server_info.name || ''} ${d.server_info.version || ''}`.trim() : '';
}

// table wraps a <tbody> the page fills in a table with a header row.
function table(headers, body, attrs) {
  return h('div', { class: 'tablewrap' }, h('table', attrs || {},
    h('thead', {}, h('tr', {}, headers.map((t) => h('th', { scope: 'col', text: t })))), body));
}

// ---- Devices

const DEVICE_STATES = ['all', 'online', 'offline', 'ready', 'degraded', 'discovering'];

function devicesPage(main, _, params) {
  const q = h('input', { id: 'dev-search', type: 'search', placeholder: 'alias, id, firmware…', autocomplete: 'off', value: params.get('q') || '' });
  const state = h('select', { id: 'dev-state' }, DEVICE_STATES.map((s) => h('option', { value: s }, s)));
  if (DEVICE_STATES.includes(params.get('state'))) state.value = params.get('state');
  const counts = h('div', { class: 'counts', id: 'dev-counts', 'aria-live': 'polite' });
  const body = h('tbody');
  const pager = h('div', { class: 'pager' });
  let page = Math.max(0, (parseInt(params.get('page'), 10) || 1) - 1);
  const save = () => setView('devices', [], { q: q.value, state: state.value === 'all' ? '' : state.value, page: page ? page + 1 : '' });
  let editing = null; // the id whose alias is being edited: renders wait
  let dirty = false;
  // In a cluster (a device or an event names a node) a Node column follows the id.
  const thead = h('thead');
  let withNode = null;
  function heads() {
    if (withNode === app.devices.nodes) return;
    withNode = app.devices.nodes;
    const cols = ['State', 'Alias', 'Id', ...(withNode ? ['Node'] : []), 'Transport', 'Dialect', 'Firmware', 'Tools', 'Last seen', 'Last error'];
    thead.replaceChildren(h('tr', {}, cols.map((t) => h('th', { scope: 'col', class: ['State', 'Alias', 'Tools'].includes(t) ? '' : 'hide-narrow', text: t }))));
  }
  main.append(
    h('div', { class: 'row' }, h('h1', { text: 'Devices' })),
    counts,
    h('div', { class: 'row', role: 'search' },
      h('label', { for: 'dev-search' }, 'Search', q),
      h('label', { for: 'dev-state' }, 'State', state)),
    h('div', { class: 'tablewrap' }, h('table', { id: 'devices' }, thead, body)),
    pager);
  const stopLive = live(counts);

  function matches(d, text, st) {
    if (st === 'online' && !d.online) return false;
    if (st === 'offline' && d.online) return false;
    if (!['all', 'online', 'offline'].includes(st) && d.state !== st) return false;
    if (!text) return true;
    return (d.alias + ' ' + d.id + ' ' + firmware(d) + ' ' + (d.transport || '') + ' ' + d.kind + ' ' + (d.node || '')).toLowerCase().includes(text);
  }

  function row(d) {
    const reason = d.online ? d.last_error : app.devices.reasons.get(d.id) || d.last_error || '';
    const aliasCell = h('td', {}, h('a', { href: '#/device/' + encodeURIComponent(d.id), text: d.alias }));
    if (app.can('admin')) {
      aliasCell.append(' ', h('button', { class: 'link', type: 'button', 'aria-label': 'Rename ' + d.alias, title: 'Rename', onclick: () => edit(aliasCell, d) }, '✎'));
    }
    return h('tr', { class: d.online ? '' : 'offline', 'data-id': d.id, 'data-state': d.state },
      h('td', { class: 'state' }, statePill(d)),
      aliasCell,
      h('td', { class: 'hide-narrow mono', text: d.id }),
      withNode ? h('td', { class: 'hide-narrow node', text: d.node || '' }) : null,
      h('td', { class: 'hide-narrow', text: d.transport || '' }),
      h('td', { class: 'hide-narrow', text: d.kind + (d.protocol_version ? ' v' + d.protocol_version : '') }),
      h('td', { class: 'hide-narrow', text: firmware(d) }),
      h('td', { text: String(d.tools) }),
      h('td', { class: 'hide-narrow', title: when(d.last_seen), text: lastSeen(d) }),
      h('td', { class: 'hide-narrow', text: reason }));
  }

  function edit(cell, d) {
    editing = d.id;
    const input = h('input', { value: d.alias, 'aria-label': 'New alias for ' + d.alias, maxLength: 63, size: 14 });
    const err = h('span', { class: 'err', role: 'alert' });
    const done = () => { editing = null; if (dirty) render(); };
    const form = h('form', { class: 'row', onsubmit: async (e) => {
      e.preventDefault();
      try {
        const nd = await api('PATCH', dev(d.id), { alias: input.value });
        app.devices.map.set(nd.id, nd);
        done();
        render();
      } catch (e2) { err.textContent = e2.message; }
    }, onkeydown: (e) => { if (e.key === 'Escape') { done(); render(); } } },
    input, h('button', { type: 'submit' }, 'Save'), h('button', { type: 'button', onclick: () => { done(); render(); } }, 'Cancel'), err);
    cell.replaceChildren(form);
    input.focus();
    input.select();
  }

  function render() {
    if (editing) { dirty = true; return; }
    dirty = false;
    const t0 = performance.now();
    heads();
    const all = app.devices.list();
    const online = all.reduce((n, d) => n + (d.online ? 1 : 0), 0);
    const text = q.value.trim().toLowerCase();
    const list = all.filter((d) => matches(d, text, state.value)).sort((a, b) => (a.alias < b.alias ? -1 : a.alias > b.alias ? 1 : 0));
    const pages = Math.max(1, Math.ceil(list.length / PAGE));
    // The page asked for in the URL is kept until the list is read.
    if (app.devices.loaded && page > pages - 1) { page = pages - 1; save(); }
    counts.replaceChildren(
      h('span', {}, h('b', { id: 'count-online', text: String(online) }), ' online'),
      h('span', {}, h('b', { id: 'count-offline', text: String(all.length - online) }), ' offline'),
      h('span', { class: 'muted', text: list.length === all.length ? `${all.length} devices` : `${list.length} of ${all.length} shown` }),
      counts.querySelector('.live') || '');
    body.replaceChildren(...list.slice(page * PAGE, (page + 1) * PAGE).map(row));
    if (!list.length) body.append(h('tr', {}, h('td', { colSpan: withNode ? 10 : 9, class: 'muted', text: app.devices.loaded ? 'No devices match.' : 'Loading…' })));
    pager.replaceChildren(
      h('button', { type: 'button', disabled: page === 0, onclick: () => { page--; save(); render(); } }, 'Previous'),
      h('span', { text: `Page ${page + 1} of ${pages}` }),
      h('button', { type: 'button', disabled: page >= pages - 1, onclick: () => { page++; save(); render(); } }, 'Next'));
    // What the browser tests measure: the time to the first full table
    // (since the page started loading) and the cost of each render.
    const ms = performance.now() - t0;
    const st = app.stats;
    st.renders++;
    st.maxRenderMs = Math.max(st.maxRenderMs, ms);
    if (app.devices.loaded && st.firstTableMs === null) st.firstTableMs = performance.now();
  }
  q.addEventListener('input', () => { page = 0; save(); render(); });
  state.addEventListener('change', () => { page = 0; save(); render(); });
  render();
  const off = app.devices.listen(render);
  const tick = setInterval(render, 15000); // keeps "last seen" fresh
  return () => { off(); stopLive(); clearInterval(tick); };
}

// ---- One device

function shellQuote(s) { return "'" + s.replace(/'/g, "'\\''") + "'"; }

// shellWord is s as one shell word: bare when that is safe, else quoted. A
// device names its tools: a name may hold ; $ # or spaces.
function shellWord(s) { return /^[A-Za-z0-9._:@%+=,\/-]+$/.test(s) ? s : shellQuote(s); }

export function curlFor(d, name, args) {
  const auth = app.me.caller === 'local' ? '' : " -H \"Authorization: Bearer $MCPGATE_API_KEY\"";
  return `curl -s -X POST ${shellQuote(location.origin + dev(d) + '/tools/call')}${auth} -H 'Content-Type: application/json' -d ${shellQuote(JSON.stringify({ name, arguments: args }))}`;
}

// cliFor puts the device and tool after --: a tool named --json or -h is
// then a tool, not a flag.
export function cliFor(d, name, args) {
  return `mcpgate --server ${shellQuote(location.origin)} call --args ${shellQuote(JSON.stringify(args))} -- ${shellWord(d)} ${shellWord(name)}`;
}

// toolCards builds each tool's card on its own: a schema no form can be
// made of gives that tool a JSON box for its arguments, and anything else
// that fails marks that tool only.
function toolCards(d, list, open, onUse) {
  return list.map((t) => {
    try {
      let form;
      try { form = schemaForm(t.inputSchema); } catch (e) { form = jsonForm('No form can be made of this tool\'s inputSchema (' + e.message + '): its arguments as one JSON object.'); }
      return toolCard(d, t, open(t), onUse, form);
    } catch (e) {
      return h('details', { class: 'card tool', open: true, 'data-tool': String(t && t.name) },
        h('summary', {}, h('code', { text: String(t && t.name) })), renderError(e));
    }
  });
}

function toolCard(d, t, open, onUse, form) {
  const out = h('div', { class: 'out', 'aria-live': 'polite' });
  const canCall = app.can('call');
  const args = () => { form.clear(); return form.values(); };
  const callBtn = canCall ? h('button', { class: 'primary', type: 'submit' }, 'Call') : null;
  const copyCurl = h('button', { type: 'button', onclick: (e) => { try { copy(curlFor(d.alias, t.name, args()), e.currentTarget); } catch {} } }, 'Copy as curl');
  const copyCLI = h('button', { type: 'button', onclick: (e) => { try { copy(cliFor(d.alias, t.name, args()), e.currentTarget); } catch {} } }, 'Copy as CLI');
  const f = h('form', { novalidate: true, onsubmit: async (e) => {
    e.preventDefault();
    if (!canCall) return;
    onUse(t.name, true);
    let a;
    try { a = args(); } catch (e2) { out.replaceChildren(renderError(new APIError(0, 'invalid_input', e2.message))); return; }
    callBtn.disabled = true;
    out.replaceChildren(h('p', { class: 'muted', text: 'Calling…' }));
    const t0 = performance.now();
    try {
      const res = await api('POST', dev(d.id) + '/tools/call', { name: t.name, arguments: a }, { exact: true });
      out.replaceChildren(renderResult(res, performance.now() - t0));
    } catch (e2) {
      if (e2.code === 'invalid_arguments') form.showProblems(e2.details && e2.details.problems);
      out.replaceChildren(renderError(e2, performance.now() - t0));
    } finally {
      callBtn.disabled = false;
    }
  } }, form.el, h('div', { class: 'row' }, callBtn, copyCurl, copyCLI,
    canCall ? null : h('span', { class: 'muted', text: 'Your key may not call tools (scope ' + app.me.scope + ').' })));
  // A click on the summary (Enter and Space too) opens or closes the card:
  // the URL names the tool last opened or called.
  const card = h('details', { class: 'card tool', open, 'data-tool': t.name },
    h('summary', { onclick: () => onUse(t.name, !card.open) }, h('code', { text: t.name }), t.userOnly ? h('span', {}, ' ', h('span', { class: 'pill user', title: 'annotations.audience is ["user"]: meant for people; hidden from AI agents on the MCP doors unless --expose-user-only', text: 'user-only' })) : ''),
    t.description ? h('p', { class: 'muted', text: t.description }) : null,
    f, out);
  return card;
}

// revokeText says what revoking a device's credentials does under the
// gateway's --device-auth (GET /api/v1/me; docs/security.md): it revokes
// every device and vision token issued to it until now and closes its
// connection, but under open a device needs no token to connect, so it may
// come straight back.
export function revokeText(mode) {
  if (mode === 'token') {
    return {
      confirm: 'Confirm: revoke its tokens and disconnect',
      help: 'Revoke credentials refuses every token issued to this device until now and closes its connection. It connects again only with a newer token: the OTA endpoint gives one whenever the device asks (its firmware does at every boot) unless --ota-policy allowlist leaves it out, and mcpgate devices token makes one.',
      after: 'It connects again only with a newer token (OTA at its next boot, or mcpgate devices token).',
    };
  }
  if (mode === 'open') {
    return {
      confirm: 'Confirm: revoke its tokens and disconnect (it may reconnect at once)',
      help: 'This gateway runs with --device-auth open: devices connect without a token. Revoke credentials closes this device\'s connection and refuses the tokens issued to it until now (its camera\'s uploads fail until its next session brings a new one), but it can reconnect at once, and a XiaoZhi device does at its next conversation. Only under --device-auth token do revoked tokens keep it out.',
      after: 'Under --device-auth open it can reconnect at once, without a token.',
    };
  }
  return {
    confirm: 'Confirm: revoke its tokens and disconnect',
    help: 'Revoke credentials refuses every token issued to this device until now and closes its connection; under --device-auth open it can reconnect at once without one.',
    after: '',
  };
}

function devicePage(main, [ref, toolName]) {
  const head = h('div');
  const tools = h('div', { id: 'tools' });
  const note = h('div', { 'aria-live': 'polite' });
  let id = ref;
  let current = toolName || ''; // the tool the URL names
  const use = (name, open) => {
    if (open) current = name;
    else if (current === name) current = '';
    setView('device', [ref, current]);
  };
  const queued = queuedCalls(() => id);
  const admin = app.can('admin') ? adminActions() : h('div');
  main.append(h('p', {}, h('a', { href: '#/devices', text: '← Devices' })), head, admin, note, queued.el, tools);
  function header() {
    const d = app.devices.get(id);
    if (!d) { head.replaceChildren(h('h1', { text: ref })); return; }
    const reason = d.online ? d.last_error : app.devices.reasons.get(d.id) || d.last_error;
    head.replaceChildren(
      // What a device names (its firmware, its errors) is isolated in the
      // console's sentences: a right-to-left override must not flip them.
      h('h1', {}, h('bdi', { text: d.alias }), ' ', statePill(d)),
      h('p', { class: 'muted', id: 'device-line' }, h('span', { class: 'mono', text: d.id }), ` · ${d.kind} · ${d.transport || ''} · `, h('bdi', { text: firmware(d) }), ` · ${d.tools} tools · last seen ${lastSeen(d)}`,
        d.node ? h('span', { id: 'device-node' }, ' · node ', h('b', { text: d.node })) : null),
      reason ? h('p', { class: d.online ? 'err' : 'muted' }, d.online ? 'Error: ' : 'Offline: ', h('bdi', { text: reason })) : '',
      h('p', {}, h('a', { href: '#/photos/' + encodeURIComponent(d.id), text: 'Photos' }), ' · ', h('a', { href: '#/audit/' + encodeURIComponent(d.id), text: 'Audit' }), ' · ', h('a', { href: '#/events/' + encodeURIComponent(d.id), text: 'Events' })));
  }
  // Two-step buttons: the first click arms, the second acts.
  function armed(label, confirm, act, attrs) {
    const b = h('button', { type: 'button', class: 'danger', ...attrs }, label);
    b.addEventListener('click', async () => {
      if (b.dataset.armed !== '1') { b.dataset.armed = '1'; b.textContent = confirm; return; }
      b.disabled = true;
      try { await act(); } catch (e) { note.replaceChildren(renderError(e)); b.disabled = false; }
    });
    return b;
  }
  // Drawn once, not with the header, so an armed button stays armed while events stream.
  function adminActions() {
    const r = revokeText(app.me.device_auth);
    return h('div', {},
      h('div', { class: 'row', id: 'device-admin' },
        armed('Revoke credentials', r.confirm, async () => {
          const res = await api('POST', dev(id) + '/revoke');
          const conn = res.disconnected ? 'its connection was closed' : res.not_disconnected ? 'its connection could not be closed: ' + res.not_disconnected : 'it was not connected';
          note.replaceChildren(h('p', { id: 'revoke-done', text: `Tokens issued until now revoked; ${conn}. ${r.after}` }));
        }, { 'aria-describedby': 'revoke-help' }),
        armed('Forget', 'Confirm: forget (disconnecting it if online)', async () => {
          await api('DELETE', dev(id) + '?force=true');
          app.devices.map.delete(id);
          app.devices.changed();
          location.hash = '#/devices';
        })),
      h('p', { class: 'muted', id: 'revoke-help', 'data-mode': app.me.device_auth || '', text: r.help }));
  }
  async function load() {
    try {
      const r = await api('GET', dev(ref) + '/tools', undefined, { exact: true }); // schemas' big integers as written
      id = r.device || id;
      const d = app.devices.get(id) || (await api('GET', dev(ref)));
      if (!app.devices.map.has(d.id)) app.devices.map.set(d.id, d);
      id = d.id;
      header();
      queued.load();
      tools.replaceChildren(h('h2', { text: `Tools (${r.tools.length})` }),
        ...(r.tools.length ? toolCards(d, r.tools, (t) => r.tools.length <= 8 || t.name === current, use) : [h('p', { class: 'muted', text: 'No tools known yet.' })]));
      // A reload or a link that names a tool comes back to it.
      const named = current && [...tools.querySelectorAll('details.tool')].find((x) => x.dataset.tool === current);
      if (named) named.scrollIntoView({ block: 'start' });
    } catch (e) {
      tools.replaceChildren(renderError(e));
      if (e.code !== 'device_not_found') { queued.load(); return; }
      // No such device, or none this key can see: that one message, nothing
      // to act on; only calls queued for it before it was forgotten show.
      admin.hidden = true;
      queued.el.hidden = true;
      if (await queued.load({ quiet: true })) queued.el.hidden = false;
    }
  }
  header();
  load();
  const off = app.devices.listen(header);
  const unsub = app.events.subscribe((ev) => {
    if (ev.device === id && ev.type === 'tools_changed') {
      note.replaceChildren(h('p', {}, 'The device\'s tools changed. ', h('button', { type: 'button', onclick: () => { note.replaceChildren(); load(); } }, 'Reload tools')));
    }
  });
  return () => { off(); unsub(); queued.stop(); };
}

// ---- A device's queued calls (docs/queued-calls.md): calls that wait for
// its next session. Those waiting first, in the order they will run, then
// the finished ones, newest first; read again when one of its calls
// changes (events) or the stream reconnects.

const QUEUE_EVENTS = new Set(['call_queued', 'call_started', 'call_expired', 'call_cancelled']);
const SHOWN_CALLS = 50;

function callResult(c) {
  if (c.state === 'done' && c.result) {
    const res = c.result;
    const text = (res.content || []).map((x) => (x && x.type === 'text' ? x.text : '[' + ((x && x.type) || '?') + ']')).join(' ');
    const summary = text.length > 120 ? text.slice(0, 120) + '…' : text || '(no content)';
    const ms = c.started_at && c.finished_at ? Date.parse(c.finished_at) - Date.parse(c.started_at) : 0;
    return h('details', {}, h('summary', {}, res.isError ? 'The device reported a failure: ' : '', h('bdi', { text: summary })), renderResult(res, ms));
  }
  if (c.reason || c.error) return h('span', { class: c.state === 'failed' ? 'err' : 'muted', text: [c.reason, c.error].filter(Boolean).join(': ') });
  return '';
}

function queuedCalls(deviceID) {
  const body = h('tbody');
  const info = h('p', { class: 'muted', id: 'queued-info' });
  const err = h('div', { 'aria-live': 'polite' });
  const el = h('section', { 'aria-labelledby': 'queued-title' },
    h('h2', { id: 'queued-title', text: 'Queued calls' }),
    h('p', { class: 'muted', text: 'Calls that wait for the device\'s next session (mcpgate call --queue, or "deliver": "queue"), and how they ended.' }),
    info, err,
    table(['State', 'Tool', 'Arguments', 'Queued', 'Expires or ended', 'Result', ''], body, { id: 'queued' }));
  let calls = [];
  let timer = 0;
  let gen = 0;
  function row(c) {
    const cell = h('td');
    if (c.state === 'queued' && app.can('call')) {
      cell.append(h('button', { type: 'button', 'aria-label': 'Cancel queued call ' + c.id + ' (' + c.tool + ')', onclick: async (e) => {
        e.currentTarget.disabled = true;
        try {
          await api('DELETE', '/api/v1/calls/' + encodeURIComponent(c.id));
          err.replaceChildren();
        } catch (e2) { err.replaceChildren(renderError(e2)); }
        load();
      } }, 'Cancel'));
    }
    const done = c.finished_at ? 'ended ' + when(c.finished_at) : '';
    return h('tr', { 'data-call': c.id, 'data-state': c.state, class: ['queued', 'running', 'done'].includes(c.state) ? '' : 'offline' },
      h('td', {}, h('span', { class: 'pill ' + c.state, text: c.state })),
      h('td', { class: 'mono', text: c.tool }),
      h('td', { class: 'mono', text: JSON.stringify(c.arguments ?? {}) }),
      h('td', { title: c.id, text: when(c.queued_at) }),
      h('td', { title: done, text: ['queued', 'running'].includes(c.state) ? when(c.expires_at) : done || when(c.expires_at) }),
      h('td', {}, callResult(c)),
      cell);
  }
  function render() {
    const waiting = calls.filter((c) => c.state === 'queued' || c.state === 'running');
    // Ended calls newest-ended first: queue order is when they were queued.
    const ended = calls.filter((c) => c.state !== 'queued' && c.state !== 'running')
      .sort((a, b) => (Date.parse(b.finished_at) || 0) - (Date.parse(a.finished_at) || 0));
    const shown = [...waiting, ...ended].slice(0, SHOWN_CALLS);
    body.replaceChildren(...shown.map(row));
    if (!shown.length) body.append(h('tr', {}, h('td', { colSpan: 7, class: 'muted', text: 'No queued calls.' })));
    info.textContent = `${waiting.length} waiting, ${calls.length - waiting.length} ended` + (shown.length < calls.length ? ` (the ${SHOWN_CALLS} shown: waiting first, then the newest)` : '');
  }
  // load reads every call of the device the gateway keeps (finished ones
  // for --queue-retention), a page of 1000 at a time.
  // quiet: a failure is not shown. It answers how many calls it read.
  async function load({ quiet = false } = {}) {
    const g = ++gen;
    const all = [];
    try {
      for (let page = 0; page < 10; page++) {
        const p = new URLSearchParams({ device: deviceID(), limit: '1000' });
        if (all.length) p.set('after', String(JSON.isRawJSON?.(all.at(-1).seq) ? all.at(-1).seq.rawJSON : all.at(-1).seq));
        const r = await api('GET', '/api/v1/calls?' + p, undefined, { exact: true });
        if (g !== gen) return;
        all.push(...r.calls);
        if (r.calls.length < 1000) break;
      }
      calls = all;
      err.replaceChildren();
      render();
      return calls.length;
    } catch (e) {
      if (g !== gen) return;
      if (e.code === 'queue_unavailable') { el.hidden = true; return; }
      if (!quiet) err.replaceChildren(renderError(e));
    }
  }
  const later = () => { if (!timer) timer = setTimeout(() => { timer = 0; load(); }, 150); };
  const unsub = app.events.subscribe((ev) => {
    if (ev.device !== deviceID()) return;
    if (QUEUE_EVENTS.has(ev.type) || (ev.type === 'call_completed' && ev.data && ev.data.queued)) later();
  });
  const unre = app.events.onReconnect(later);
  body.append(h('tr', {}, h('td', { colSpan: 7, class: 'muted', text: 'Loading…' })));
  return { el, load, stop: () => { unsub(); unre(); clearTimeout(timer); gen++; } };
}

// ---- Events

const EVENT_TYPES = ['device_online', 'device_state', 'tools_changed', 'call_completed', 'alias_changed', 'device_offline', 'device_forgotten',
  'call_queued', 'call_started', 'call_expired', 'call_cancelled'];

function eventsPage(main, [ref], params) {
  const dq = h('input', { id: 'ev-device', type: 'search', value: ref || '', placeholder: 'alias or id' });
  const kind = h('select', { id: 'ev-type' }, h('option', { value: '' }, 'all kinds'), EVENT_TYPES.map((t) => h('option', { value: t }, t)));
  if (EVENT_TYPES.includes(params.get('kind'))) kind.value = params.get('kind');
  const save = () => setView('events', [dq.value.trim()], { kind: kind.value });
  const pause = h('input', { id: 'ev-pause', type: 'checkbox' });
  const body = h('tbody');
  const head = h('div', { class: 'row' }, h('h1', { text: 'Events' }));
  main.append(head, h('p', { class: 'muted', text: 'Live, since this page was opened; newest first.' }),
    h('div', { class: 'row', role: 'search' }, h('label', { for: 'ev-device' }, 'Device', dq), h('label', { for: 'ev-type' }, 'Kind', kind),
      h('label', { for: 'ev-pause', class: 'switch' }, pause, 'Pause')),
    table(['Time', 'Kind', 'Device', 'Details'], body, { id: 'events' }));
  const thead = main.querySelector('#events thead');
  const stopLive = live(head);
  let timer = 0;
  function render() {
    timer = 0;
    if (pause.checked) return;
    const t = dq.value.trim().toLowerCase();
    const shown = [];
    for (let i = app.log.length - 1; i >= 0 && shown.length < 300; i--) {
      const ev = app.log[i];
      if (kind.value && ev.type !== kind.value) continue;
      if (t && !(ev.device.toLowerCase().includes(t) || (ev.alias || '').includes(t))) continue;
      shown.push(ev);
    }
    // In a cluster, each event with the node where it happened.
    const withNode = app.devices.nodes;
    const cols = ['Time', 'Kind', 'Device', ...(withNode ? ['Node'] : []), 'Details'];
    if (thead.rows[0].cells.length !== cols.length) thead.replaceChildren(h('tr', {}, cols.map((c) => h('th', { scope: 'col', text: c }))));
    const rows = shown.map((ev) => h('tr', { 'data-type': ev.type },
      h('td', { title: ev.time, text: new Date(ev.time).toLocaleTimeString() }),
      h('td', { text: ev.type }),
      h('td', {}, h('a', { href: '#/device/' + encodeURIComponent(ev.device), text: ev.alias || ev.device })),
      withNode ? h('td', { class: 'node', text: ev.node || '' }) : null,
      h('td', { class: 'mono', text: ev.data ? JSON.stringify(ev.data) : '' })));
    body.replaceChildren(...rows);
    if (!rows.length) body.append(h('tr', {}, h('td', { colSpan: cols.length, class: 'muted', text: 'No events yet.' })));
  }
  const later = () => { if (!timer) timer = setTimeout(render, 150); };
  dq.addEventListener('input', () => { save(); render(); });
  kind.addEventListener('change', () => { save(); render(); });
  pause.addEventListener('change', render);
  render();
  const unsub = app.events.subscribe(later);
  return () => { unsub(); stopLive(); clearTimeout(timer); };
}

// ---- Audit

// AUDIT_OUTCOMES are the gateway's error codes an audit record's outcome can
// hold (docs/audit.md), besides ok and tool_error: a call's, a queued call's
// and an administrative action's.
const AUDIT_OUTCOMES = ['invalid_arguments', 'tool_not_found', 'tool_hidden', 'device_not_found', 'device_offline', 'device_timeout',
  'device_disconnected', 'device_busy', 'device_bad_response', 'rate_limited', 'queue_full', 'client_closed', 'expired', 'cancelled',
  'interrupted', 'forbidden', 'denied', 'internal', 'device_online', 'store_error', 'revocation_not_saved', 'bad_request', 'key_not_found'];

function auditPage(main, [ref], params) {
  const fields = {
    device: h('input', { id: 'au-device', value: ref || '', placeholder: 'alias or id' }),
    tool: h('input', { id: 'au-tool', placeholder: 'exact tool name', value: params.get('tool') || '' }),
    caller: h('input', { id: 'au-caller', placeholder: 'key id or local', value: params.get('caller') || '' }),
    since: h('input', { id: 'au-since', placeholder: '1h, 7d or a time', value: params.get('since') || '' }),
  };
  const outcome = h('select', { id: 'au-outcome' }, [['', 'any'], ['ok', 'ok'], ['error', 'any failure'], ['tool_error', 'tool_error (the device failed)'],
    ...AUDIT_OUTCOMES.map((c) => [c, c])]
    .map(([v, label]) => h('option', { value: v }, label)));
  // An outcome the list lacks (a link from a newer gateway) is kept as its
  // own option, not silently dropped for "any".
  const asked = params.get('outcome') || '';
  if (asked && !['', 'ok', 'error', 'tool_error', ...AUDIT_OUTCOMES].includes(asked)) outcome.append(h('option', { value: asked }, asked));
  outcome.value = asked;
  const body = h('tbody');
  const pager = h('div', { class: 'pager' });
  const err = h('div');
  const stack = []; // the before cursors of the pages seen, for Newer
  let cursor = '';
  const form = h('form', { class: 'row', role: 'search', onsubmit: (e) => { e.preventDefault(); stack.length = 0; load(''); } },
    Object.entries(fields).map(([k, el]) => h('label', { for: el.id }, k[0].toUpperCase() + k.slice(1), el)),
    h('label', { for: 'au-outcome' }, 'Outcome', outcome),
    h('button', { type: 'submit', class: 'primary' }, 'Filter'));
  main.append(h('h1', { text: 'Audit' }), form, err,
    table(['Time', 'Device', 'Tool', 'Caller', 'Door', 'Outcome', 'Latency', 'Arguments'], body, { id: 'audit' }), pager);
  let gen = 0; // bumped by each load and by leaving: a late answer is dropped
  async function load(before) {
    const g = ++gen;
    const p = new URLSearchParams({ limit: '50' });
    for (const [k, el] of Object.entries(fields)) if (el.value.trim()) p.set(k, el.value.trim());
    if (outcome.value) p.set('outcome', outcome.value);
    if (before) p.set('before', before);
    err.replaceChildren();
    try {
      const r = await api('GET', '/api/v1/audit?' + p, undefined, { exact: true });
      // Left, or filtered again, meanwhile: this answer would undo that
      // (and write the audit filters into another page's URL).
      if (g !== gen) return;
      cursor = before;
      const { device, ...rest } = Object.fromEntries(Object.entries(fields).map(([k, el]) => [k, el.value.trim()]));
      setView('audit', [device], { ...rest, outcome: outcome.value, before });
      const recs = r.records;
      body.replaceChildren(...recs.map((x) => h('tr', { class: x.outcome === 'ok' ? '' : 'bad', 'data-seq': x.seq },
        h('td', { title: x.time, text: when(x.time) }),
        h('td', { text: x.alias || x.device }),
        h('td', { class: 'mono', text: x.tool }),
        h('td', { class: 'mono', text: x.caller }),
        h('td', { text: x.door }),
        h('td', { class: x.outcome === 'ok' ? '' : 'err', title: x.error || '', text: x.outcome + (x.error ? ': ' + x.error : '') }),
        h('td', { text: x.latency_ms.toFixed(1) + ' ms' }),
        h('td', { class: 'mono', text: JSON.stringify(x.arguments) }))));
      if (!recs.length) body.append(h('tr', {}, h('td', { colSpan: 8, class: 'muted', text: 'No records match.' })));
      pager.replaceChildren(
        // After a reload on an older page, Newer goes back to the newest.
        h('button', { type: 'button', disabled: !cursor, onclick: () => load(stack.length ? stack.pop() : '') }, 'Newer'),
        h('button', { type: 'button', disabled: !r.next, onclick: () => { stack.push(cursor); load(r.next); } }, 'Older'));
    } catch (e) {
      if (g === gen) err.replaceChildren(renderError(e));
    }
  }
  load(params.get('before') || '');
  return () => { gen++; };
}

// ---- Photos

function photosPage(main, [ref]) {
  const pick = h('select', { id: 'ph-device' });
  const grid = h('div', { class: 'gallery', id: 'photos' });
  const urls = [];
  main.append(h('h1', { text: 'Photos' }), h('div', { class: 'row' }, h('label', { for: 'ph-device' }, 'Device', pick)), grid);
  function options() {
    const list = app.devices.list().sort((a, b) => (a.alias < b.alias ? -1 : 1));
    pick.replaceChildren(h('option', { value: '' }, '— choose a device —'), ...list.map((d) => h('option', { value: d.id }, d.alias)));
    if (ref) pick.value = app.devices.get(ref)?.id || '';
  }
  async function load() {
    for (const u of urls.splice(0)) URL.revokeObjectURL(u);
    grid.replaceChildren();
    if (!pick.value) return;
    try {
      const r = await api('GET', dev(pick.value) + '/photos');
      if (!r.photos.length) { grid.append(h('p', { class: 'muted', text: 'No photos from this device.' })); return; }
      for (const p of r.photos.slice(0, 60)) {
        const img = h('img', { alt: p.question ? 'Photo: ' + p.question : 'Photo ' + p.id, loading: 'lazy' });
        grid.append(h('figure', {}, img, h('figcaption', {}, when(p.taken_at), p.question ? h('br') : '', h('bdi', { text: p.question || '' }), p.explanation ? h('br') : '', h('bdi', { text: p.explanation || p.model_error || '' }))));
        raw(dev(pick.value) + '/photos/' + encodeURIComponent(p.id)).then((res) => res.blob()).then((b) => {
          const u = URL.createObjectURL(b);
          urls.push(u);
          img.src = u;
        }).catch(() => {});
      }
    } catch (e) {
      grid.replaceChildren(renderError(e));
    }
  }
  options();
  if (app.devices.loaded) load();
  else { const off = app.devices.listen(() => { off(); options(); load(); }); }
  pick.addEventListener('change', () => { location.hash = '#/photos/' + encodeURIComponent(pick.value); });
  return () => { for (const u of urls) URL.revokeObjectURL(u); };
}

// ---- Sources: MCP servers through /mcp/endpoint (mcpgate bridge among
// them) and devices of the registration dialect.

function sourcesPage(main) {
  const body = h('tbody');
  main.append(h('h1', { text: 'Sources' }),
    h('p', { class: 'muted', text: 'MCP servers connected at /mcp/endpoint (mcpgate bridge included) and devices of the registration dialect.' }),
    table(['State', 'Name', 'Kind', 'Transport', 'Remote', 'Server', 'Tools', 'Last seen', 'Last error'], body, { id: 'sources' }));
  function render() {
    const list = app.devices.list().filter((d) => d.kind !== 'xiaozhi').sort((a, b) => (a.alias < b.alias ? -1 : 1));
    body.replaceChildren(...list.map((d) => h('tr', { class: d.online ? '' : 'offline' },
      h('td', {}, statePill(d)),
      h('td', {}, h('a', { href: '#/device/' + encodeURIComponent(d.id), text: d.alias })),
      h('td', { text: d.kind }), h('td', { text: d.transport || '' }), h('td', { class: 'mono', text: d.remote || '' }),
      h('td', { text: firmware(d) }), h('td', { text: String(d.tools) }), h('td', { text: lastSeen(d) }),
      h('td', { text: d.online ? d.last_error || '' : app.devices.reasons.get(d.id) || d.last_error || '' }))));
    if (!list.length) body.append(h('tr', {}, h('td', { colSpan: 9, class: 'muted', text: 'No sources: see docs/endpoint.md and mcpgate bridge.' })));
  }
  render();
  return app.devices.listen(render);
}

// ---- Keys

function keysPage(main) {
  if (!app.keyAdmin()) {
    main.append(h('h1', { text: 'Keys' }), h('p', { class: 'err', text: 'Managing keys needs an admin key limited to no devices and no tools.' }));
    return;
  }
  const body = h('tbody');
  const out = h('div', { 'aria-live': 'polite' });
  const name = h('input', { id: 'k-name', required: true, placeholder: 'who or what uses it' });
  const scope = h('select', { id: 'k-scope' }, ['read', 'call', 'admin'].map((s) => h('option', { value: s }, s)));
  const devices = h('input', { id: 'k-devices', placeholder: 'kitchen*,aa:bb:*' });
  const tools = h('input', { id: 'k-tools', placeholder: 'self.audio_speaker.*' });
  const expires = h('input', { id: 'k-expires', placeholder: '30d (empty: never)' });
  const split = (s) => s.split(',').map((x) => x.trim()).filter(Boolean);
  const form = h('form', { class: 'row', id: 'key-create', onsubmit: async (e) => {
    e.preventDefault();
    try {
      const k = await api('POST', '/api/v1/keys', { name: name.value, scope: scope.value, devices: split(devices.value), tools: split(tools.value), expires: expires.value.trim() });
      const btn = h('button', { type: 'button', onclick: (ev) => copy(k.secret, ev.currentTarget) }, 'Copy');
      out.replaceChildren(h('div', { class: 'card' }, h('p', {}, h('strong', { text: `Key ${k.id} (${k.name}, ${k.scope}) created.` }), ' Its secret is shown only now:'),
        h('p', { class: 'secret', id: 'new-secret', 'data-name': k.name, text: k.secret }), btn));
      form.reset();
      load();
    } catch (e2) { out.replaceChildren(renderError(e2)); }
  } },
  h('label', { for: 'k-name' }, 'Name', name), h('label', { for: 'k-scope' }, 'Scope', scope),
  h('label', { for: 'k-devices' }, 'Devices', devices), h('label', { for: 'k-tools' }, 'Tools', tools),
  h('label', { for: 'k-expires' }, 'Expires', expires), h('button', { class: 'primary', type: 'submit' }, 'Create key'));
  main.append(h('h1', { text: 'Keys' }), table(['Id', 'Name', 'Scope', 'Devices', 'Tools', 'Status', 'Created', 'Expires', ''], body, { id: 'keys' }),
    h('h2', { text: 'Create a key' }), form, out);
  async function load() {
    try {
      const r = await api('GET', '/api/v1/keys');
      body.replaceChildren(...r.keys.map((k) => {
        const cell = h('td');
        if (k.status !== 'revoked') {
          const revoke = h('button', { class: 'danger', type: 'button', 'aria-label': 'Revoke ' + k.id }, 'Revoke');
          revoke.addEventListener('click', async () => {
            if (revoke.dataset.armed !== '1') { revoke.dataset.armed = '1'; revoke.textContent = 'Confirm revoke'; return; }
            try { await api('DELETE', '/api/v1/keys/' + encodeURIComponent(k.id)); load(); } catch (e) { out.replaceChildren(renderError(e)); }
          });
          cell.append(revoke);
        }
        return h('tr', { 'data-key': k.id, class: k.status === 'active' ? '' : 'offline' },
          h('td', { class: 'mono', text: k.id + (k.id === app.me.caller ? ' (you)' : '') }), h('td', { text: k.name }), h('td', { text: k.scope }),
          h('td', { text: k.devices.join(', ') || 'all' }), h('td', { text: k.tools.join(', ') || 'all' }), h('td', { text: k.status }),
          h('td', { text: when(k.created_at) }), h('td', { text: k.expires_at ? when(k.expires_at) : 'never' }), cell);
      }));
    } catch (e) { out.replaceChildren(renderError(e)); }
  }
  load();
}

// ---- Overview: small charts from /metrics, sampled every 5 s.

function parseMetrics(text) {
  const m = {};
  for (const line of text.split('\n')) {
    if (!line.startsWith('mcpgate_')) continue;
    const sp = line.lastIndexOf(' ');
    const k = line.slice(0, sp);
    m[k] = Number(line.slice(sp + 1));
  }
  return m;
}

function sum(m, prefix, pred) {
  let s = 0;
  for (const [k, v] of Object.entries(m)) if (k.startsWith(prefix) && (!pred || pred(k))) s += v;
  return s;
}

function spark(values, max) {
  const n = values.length;
  const top = Math.max(max || 0, ...values, 1e-9);
  const pts = values.map((v, i) => `${n < 2 ? 0 : (i / (n - 1)) * 100},${30 - (v / top) * 28}`).join(' ');
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  svg.setAttribute('viewBox', '0 0 100 30');
  svg.setAttribute('preserveAspectRatio', 'none');
  svg.setAttribute('aria-hidden', 'true');
  const pl = document.createElementNS('http://www.w3.org/2000/svg', 'polyline');
  pl.setAttribute('points', pts);
  pl.setAttribute('vector-effect', 'non-scaling-stroke');
  svg.append(pl);
  return svg;
}

const samples = []; // kept across visits to the page: {t, calls, errors, online, known}

// resetPages forgets what pages keep across visits, for another key's session.
export function resetPages() { samples.length = 0; }

// A key limited to some devices counts only the devices it can list (the
// other devices do not exist for it); the call charts, from /metrics, are
// the whole gateway's, and say so.
function overviewPage(main) {
  const limited = app.me.devices.length > 0;
  const whole = limited ? ' (whole gateway)' : '';
  const charts = h('div', { class: 'charts', id: 'charts' });
  const err = h('div');
  const info = h('p', { class: 'muted', id: 'overview-info' });
  main.append(h('h1', { text: 'Overview' }), info, charts, err);
  let health = null;
  const seen = () => {
    const list = app.devices.list();
    return { known: list.length, online: list.reduce((n, d) => n + (d.online ? 1 : 0), 0) };
  };
  function chart(title, value, series, max) {
    return h('div', { class: 'card chart' }, h('div', { class: 'muted', text: title }), h('div', { class: 'value', text: value }), spark(series, max));
  }
  function render() {
    const rates = [], errs = [];
    for (let i = 1; i < samples.length; i++) {
      const a = samples[i - 1], b = samples[i];
      const dt = (b.t - a.t) / 1000;
      const calls = Math.max(0, b.calls - a.calls);
      rates.push(calls / dt);
      errs.push(calls ? (100 * Math.max(0, b.errors - a.errors)) / calls : 0);
    }
    const last = limited ? (app.devices.loaded ? seen() : null) : samples[samples.length - 1];
    charts.replaceChildren(
      chart('Calls per second' + whole, rates.length ? rates[rates.length - 1].toFixed(2) : '…', rates),
      chart('Error rate (calls not ok, %)' + whole, errs.length ? errs[errs.length - 1].toFixed(1) + ' %' : '…', errs, 100),
      chart('Devices online', last ? `${last.online} of ${last.known}` : '…', samples.map((s) => s.online), last ? last.known : 1));
    if (!health || (limited && !app.devices.loaded)) return;
    const r = health;
    const c = limited ? seen() : { known: r.devices, online: r.online };
    let text = `mcpgate ${r.version} · ${c.known} devices ${limited ? 'this key can see' : 'known'}, ${c.online} online`;
    // A cluster node: which one, the members it sees, and whether it reaches NATS (docs/cluster.md).
    if (r.cluster) text += ` · node ${r.node} of ${r.cluster.members.join(', ')}${r.cluster.nats_connected ? '' : ' · NATS NOT connected'}`;
    info.textContent = `${text} · sampled every 5 s`;
  }
  async function sample() {
    try {
      const m = parseMetrics(await (await raw('/metrics')).text());
      const c = limited ? seen() : { online: m.mcpgate_devices_online || 0, known: m.mcpgate_devices_known || 0 };
      samples.push({
        t: Date.now(),
        calls: sum(m, 'mcpgate_tool_calls_total'),
        errors: sum(m, 'mcpgate_tool_calls_total', (k) => !k.includes('outcome="ok"')),
        online: c.online,
        known: c.known,
      });
      if (samples.length > 60) samples.shift();
      err.replaceChildren();
      render();
    } catch (e) { err.replaceChildren(renderError(e)); }
  }
  api('GET', '/healthz').then((r) => { health = r; render(); }).catch(() => {});
  render();
  sample();
  const off = limited ? app.devices.listen(render) : () => {};
  const first = setTimeout(sample, 1000); // a first rate after a second, not five
  const t = setInterval(sample, 5000);
  return () => { off(); clearTimeout(first); clearInterval(t); };
}

// ---- OAuth consent: an MCP client asks for access (internal/oauth); an
// admin chooses what its token may do, or denies.

function consentPage(main, [id]) {
  main.append(h('h1', { text: 'Authorize an MCP client' }));
  const out = h('div', { 'aria-live': 'polite' });
  if (!app.keyAdmin()) {
    main.append(h('p', { class: 'err', text: 'Granting access makes an API key: sign in with an admin key limited to no devices and no tools.' }));
    return;
  }
  const scope = h('select', { id: 'c-scope' }, ['read', 'call', 'admin'].map((s) => h('option', { value: s }, s)));
  const devices = h('input', { id: 'c-devices', placeholder: 'all; or kitchen*,aa:bb:*' });
  const tools = h('input', { id: 'c-tools', placeholder: 'all; or self.audio_speaker.*' });
  const expires = h('input', { id: 'c-expires', value: '30d', placeholder: '30d (empty: 30d; a client key always expires)' });
  const split = (s) => s.split(',').map((x) => x.trim()).filter(Boolean);
  const decide = async (approve) => {
    try {
      const body = approve ? { approve, scope: scope.value, devices: split(devices.value), tools: split(tools.value), expires: expires.value.trim() } : { approve };
      const r = await api('POST', '/api/v1/oauth/requests/' + encodeURIComponent(id), body);
      out.replaceChildren(h('p', { text: approve ? 'Access granted: returning to the client…' : 'Access denied: returning to the client…' }));
      location.assign(r.redirect);
    } catch (e) { out.replaceChildren(renderError(e)); }
  };
  api('GET', '/api/v1/oauth/requests/' + encodeURIComponent(id)).then((r) => {
    // Clients often ask for every scope offered: admin is never preset.
    scope.value = r.scope === 'read' ? 'read' : 'call';
    let host = r.redirect_uri;
    // A native app's private scheme (cursor://...) has no origin ("null"):
    // the whole URI says where the code goes.
    try { const o = new URL(r.redirect_uri).origin; if (o !== 'null') host = o; } catch {}
    main.append(h('div', { class: 'card', id: 'consent' },
      h('p', {}, h('strong', {}, h('bdi', { text: r.client_name })), ' asks to use this gateway\'s MCP doors.'),
      h('p', { class: 'muted' }, 'It will be sent back to ', h('code', { text: host }), '. Client id ', h('code', { text: r.client_id }), r.resource ? ', for ' : '', r.resource ? h('code', { text: r.resource }) : ''),
      h('p', { class: 'muted', text: `It asks for scope ${r.scope || '(none named)'}. Its token is an API key with what you choose here, listed on the Keys page, where you can revoke it.` }),
      h('form', { class: 'row', onsubmit: (e) => { e.preventDefault(); decide(true); } },
        h('label', { for: 'c-scope' }, 'Scope', scope), h('label', { for: 'c-devices' }, 'Devices', devices),
        h('label', { for: 'c-tools' }, 'Tools', tools), h('label', { for: 'c-expires' }, 'Expires', expires),
        h('button', { class: 'primary', type: 'submit', id: 'c-approve' }, 'Approve'),
        h('button', { type: 'button', class: 'danger', id: 'c-deny', onclick: () => decide(false) }, 'Deny'))), out);
  }).catch((e) => main.append(renderError(e)));
}

export const pages = {
  overview: overviewPage, devices: devicesPage, device: devicePage, events: eventsPage,
  audit: auditPage, photos: photosPage, sources: sourcesPage, keys: keysPage, consent: consentPage,
};
