// Rendering a tool's result as a person expects: text, pretty JSON when the
// text is JSON, images inline, audio playable, failures in red with the
// gateway's error code or the device's own words.
import { h } from './dom.js';
import { raw } from './api.js';
import { parseExact } from './json.js';

// photoOf returns the stored photo's URL when a text result is the vision
// endpoint's answer (docs/vision.md): the camera tool's photo, shown inline.
function photoOf(text) {
  try {
    const v = JSON.parse(text);
    if (v && typeof v.url === 'string' && /^\/api\/v1\/devices\/[^/]+\/photos\/[^/]+$/.test(v.url)) return v.url;
  } catch {}
  return null;
}

function photo(url) {
  const img = h('img', { alt: 'photo stored by the gateway' });
  raw(url).then((r) => r.blob()).then((b) => { img.src = URL.createObjectURL(b); }).catch(() => img.remove());
  return img;
}

function pretty(text) {
  const t = text.trim();
  if (!(t.startsWith('{') || t.startsWith('['))) return null;
  try { return JSON.stringify(parseExact(t), null, 2); } catch { return null; }
}

function dataURL(mime, data) { return `data:${mime || 'application/octet-stream'};base64,${data}`; }

function item(c) {
  if (!c || typeof c !== 'object') return h('pre', { text: JSON.stringify(c) });
  switch (c.type) {
    case 'text': {
      const p = pretty(c.text || '');
      const pre = h('pre', { class: p ? 'json' : '', text: p ?? c.text ?? '' });
      const url = p && photoOf(c.text);
      return url ? h('div', {}, photo(url), pre) : pre;
    }
    case 'image': {
      let { mimeType, data } = c;
      if (!data && typeof c.image === 'string') {
        // XiaoZhi firmware's raw form: the image member is a JSON string.
        try { ({ mimeType, data } = JSON.parse(c.image)); } catch {}
      }
      if (!data) break;
      return h('img', { src: dataURL(mimeType, data), alt: 'image from the device' });
    }
    case 'audio':
      if (!c.data) break;
      return h('audio', { controls: true, src: dataURL(c.mimeType, c.data), 'aria-label': 'audio from the device' });
    case 'resource': {
      const r = c.resource || {};
      if (r.text !== undefined) return h('pre', { text: pretty(r.text) ?? r.text });
      if (r.blob && (r.mimeType || '').startsWith('image/')) return h('img', { src: dataURL(r.mimeType, r.blob), alt: r.uri || 'resource' });
      break;
    }
    case 'resource_link':
      return h('p', {}, 'Resource: ', h('code', { text: c.uri || '' }), c.name ? h('span', {}, ' (', h('bdi', { text: c.name }), ')') : '');
  }
  return h('pre', { class: 'json', text: JSON.stringify(c, null, 2) });
}

// renderResult renders a CallToolResult.
export function renderResult(res, ms) {
  const items = (res.content || []).map(item);
  if (res.structuredContent !== undefined && !(res.content || []).length) {
    items.push(h('pre', { class: 'json', text: JSON.stringify(res.structuredContent, null, 2) }));
  }
  const head = h('p', {}, h('strong', { text: res.isError ? 'The device reported a failure' : 'Result' }), h('span', { class: 'muted', text: ` · ${fmtMs(ms)}` }));
  return h('div', { class: 'result' + (res.isError ? ' error' : ''), role: 'status', 'data-outcome': res.isError ? 'tool_error' : 'ok' }, head,
    items.length ? items : h('p', { class: 'muted', text: '(no content)' }));
}

// renderError renders a gateway error (an APIError) or a network failure.
export function renderError(e, ms) {
  return h('div', { class: 'result error', role: 'alert', 'data-outcome': e.code || 'error' },
    h('p', {}, h('strong', { text: e.code || (e.status ? 'HTTP ' + e.status : 'error') }), ms !== undefined ? h('span', { text: ` · ${fmtMs(ms)}` }) : ''),
    h('p', { text: e.message }));
}

export function fmtMs(ms) { return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`; }
