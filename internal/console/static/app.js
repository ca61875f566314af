// The console's shell: sign-in, navigation, the shared event stream and
// device list, and the router. Pages live in pages.js.
import { api, key, onUnauthorized, Events } from './api.js';
import { h } from './dom.js';
import { Devices } from './devices.js';
import { pages, resetPages } from './pages.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const top = document.getElementById('top');

export const app = {
  me: null,
  events: new Events(),
  devices: null,
  log: [], // the latest events, newest last, for the Events page
  stats: { renders: 0, maxRenderMs: 0, firstTableMs: null, listedMs: null }, // the devices table's, for the browser tests
  can(scope) {
    const order = { none: 0, read: 1, call: 2, admin: 3 };
    return !!this.me && order[this.me.scope] >= order[scope];
  },
  // keyAdmin: the key routes need admin without device or tool limits.
  keyAdmin() { return this.can('admin') && !this.me.devices.length && !this.me.tools.length; },
};
window.mcpgate = app; // for the browser tests and the curious
app.devices = new Devices(app.events);
app.events.subscribe((ev) => {
  app.log.push(ev);
  if (app.log.length > 2000) app.log.splice(0, app.log.length - 1000);
});

const NAV = [
  ['overview', 'Overview'], ['devices', 'Devices'], ['events', 'Events'], ['audit', 'Audit'],
  ['photos', 'Photos'], ['sources', 'Sources'], ['keys', 'Keys'],
];

let cleanup = null;
let heartbeat = 0; // asks who we are every 30 s: an idle tab notices a revoked key

// setView keeps a page's view (its device, tool, filters, page of a list)
// in the URL, so a reload or Back comes back to it: #/page/arg...?k=v. It
// replaces the history entry rather than adding one (the hash does not
// change, so the page is not drawn again): pages are entries, their
// filters are not.
export function setView(page, args, params) {
  const path = '#/' + [page, ...(args || []).filter((a) => a !== undefined && a !== null && a !== '').map((a) => encodeURIComponent(a))].join('/');
  const qs = new URLSearchParams(Object.entries(params || {}).filter(([, v]) => v !== undefined && v !== null && v !== '' && v !== false)).toString();
  const url = path + (qs ? '?' + qs : '');
  if (location.hash !== url) history.replaceState(history.state, '', url);
}

function route(ev) {
  if (!app.me) return;
  if (cleanup) { cleanup(); cleanup = null; }
  const all = location.hash.replace(/^#\/?/, '');
  const q = all.indexOf('?');
  const hash = q < 0 ? all : all.slice(0, q);
  const params = new URLSearchParams(q < 0 ? '' : all.slice(q + 1));
  const [name, ...rest] = hash.split('/');
  const page = pages[name] ? name : 'devices';
  for (const a of nav.querySelectorAll('a')) {
    if (a.dataset.page === page || (page === 'device' && a.dataset.page === 'devices')) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  main.replaceChildren();
  document.title = 'mcpgate · ' + (NAV.find((n) => n[0] === page)?.[1] || (page === 'consent' ? 'Authorize' : 'Device'));
  // A hand-typed or truncated hash may not decode: take it as typed.
  const arg = (s) => { try { return decodeURIComponent(s); } catch { return s; } };
  cleanup = pages[page](main, rest.map(arg), params) || null;
  // A keyboard or screen-reader user lands on the new page, not the old link.
  if (ev) main.focus({ preventScroll: true });
}

function showNav() {
  nav.replaceChildren(...NAV.filter(([p]) => p !== 'keys' || app.keyAdmin()).map(([p, label]) => h('a', { href: '#/' + p, 'data-page': p }, label)));
  document.getElementById('who').textContent = app.me.caller === 'local' ? 'open gateway (no key)' : `${app.me.name} · ${app.me.scope}`;
  const out = document.getElementById('signout');
  out.hidden = app.me.caller === 'local';
  top.hidden = false;
}

async function start() {
  showNav();
  clearInterval(heartbeat);
  heartbeat = setInterval(() => api('GET', '/api/v1/me').catch(() => {}), 30000);
  resume(); // the event stream, unless the tab opened hidden
  app.devices.load().catch(() => {});
  route();
}

function signin(message) {
  if (cleanup) { cleanup(); cleanup = null; }
  app.me = null;
  clearInterval(heartbeat);
  app.events.stop();
  // The next key may see less: nothing the last one saw stays.
  app.log.length = 0;
  app.devices.reset();
  resetPages();
  top.hidden = true;
  const input = h('input', { id: 'key', name: 'key', type: 'password', autocomplete: 'off', spellcheck: 'false', required: true, placeholder: 'mgk_…', 'aria-describedby': 'signin-err' });
  const err = h('p', { class: 'err', id: 'signin-err', role: 'alert', text: message || '' });
  const button = h('button', { class: 'primary', type: 'submit' }, 'Sign in');
  const form = h('form', { class: 'signin card', id: 'signin', onsubmit: async (e) => {
    e.preventDefault();
    button.disabled = true;
    key.set(input.value.trim());
    try {
      app.me = await api('GET', '/api/v1/me');
      start();
    } catch (e2) {
      key.set('');
      err.textContent = e2.status === 401 ? 'That key was refused: ' + e2.message : e2.message;
      button.disabled = false;
      input.focus();
    }
  } },
  h('h1', { text: 'Sign in to mcpgate' }),
  h('p', { class: 'muted', text: 'This gateway needs an API key. Paste one (mcpgate keys create); it is kept for this tab only.' }),
  h('div', { class: 'field' }, h('label', { for: 'key', text: 'API key' }), input), err, button);
  main.replaceChildren(form);
  input.focus();
}

// A 401 while signed in (a revoked or expired key) ends the session; the
// sign-in form and the first request handle their own.
onUnauthorized((e) => {
  if (!app.me) return;
  key.set('');
  signin('Signed out: the gateway refused the key (' + e.message + ').');
});

// A hidden tab lets go of its event stream: a browser keeps few
// connections per host (six in Chromium over HTTP/1.1), and a page kept in
// the back/forward cache would hold its stream open. Shown again, it reads
// the stream anew and, as after any reconnect, reads its lists again.
function pause() { if (app.me) app.events.stop(); }
function resume() { if (app.me && document.visibilityState === 'visible') app.events.start(); }
document.addEventListener('visibilitychange', () => (document.visibilityState === 'visible' ? resume() : pause()));
window.addEventListener('pagehide', pause);
window.addEventListener('pageshow', resume);
document.addEventListener('freeze', pause);
document.addEventListener('resume', resume);

document.getElementById('signout').addEventListener('click', () => { key.set(''); signin('Signed out.'); });
// The skip link moves focus to the page, not to a #main route (the router
// took it for the devices page).
document.querySelector('a.skip').addEventListener('click', (e) => { e.preventDefault(); main.focus(); });
window.addEventListener('hashchange', route);

(async () => {
  try {
    app.me = await api('GET', '/api/v1/me');
  } catch (e) {
    if (e.status === 401) {
      const had = key.get();
      key.set('');
      signin(had ? 'The key of this tab was refused: ' + e.message : '');
      return;
    }
    main.replaceChildren(h('p', { class: 'err', text: e.code === 'unreachable' ? e.message : 'Cannot reach the gateway: ' + e.message }));
    return;
  }
  start();
})();
