// A form generated from a tool's inputSchema: numbers with a range as a
// slider and a number box, enums as a select, booleans as a switch, strings
// as a text box, anything else (objects, arrays, unions) as a JSON editor
// checked as it is typed. Gateway invalid_arguments problems are shown next
// to the field their JSON pointer names.
import { h, uid } from './dom.js';
import { parseExact, exactInteger } from './json.js';

// A schema read exactly (api's exact) keeps an integer beyond 2^53 as a raw
// JSON value: text shows it as written.
const isRaw = (v) => !!JSON.isRawJSON?.(v);
const text = (v) => (isRaw(v) ? v.rawJSON : String(v));

function typeOf(s) {
  if (!s) return 'json';
  if (Array.isArray(s.enum) && s.enum.length && s.enum.every((v) => ['string', 'number', 'boolean'].includes(typeof v) || isRaw(v))) return 'enum';
  let t = s.type;
  if (Array.isArray(t)) t = t.filter((x) => x !== 'null').length === 1 ? t.find((x) => x !== 'null') : null;
  if (t === 'integer' || t === 'number' || t === 'boolean' || t === 'string') return t;
  return 'json';
}

function field(name, s, required) {
  const id = uid('f');
  const errId = id + '-err';
  const kind = typeOf(s);
  const hintId = s && s.description ? id + '-hint' : null;
  const described = [hintId, errId].filter(Boolean).join(' ');
  const label = h('label', { for: id }, name, required ? h('span', { 'aria-hidden': 'true' }, ' *') : '', ' ',
    h('span', { class: 'muted', text: kind === 'json' ? (s && s.type ? String(s.type) : 'JSON') : kind }));
  const err = h('p', { class: 'fielderr', id: errId, 'aria-live': 'polite' });
  let input, get;
  const def = s && s.default;
  if (kind === 'integer' || kind === 'number') {
    const bound = (v) => (v === undefined ? undefined : isRaw(v) ? v.rawJSON : v);
    const min = bound(s.minimum ?? s.exclusiveMinimum);
    const max = bound(s.maximum ?? s.exclusiveMaximum);
    const step = kind === 'integer' ? 1 : 'any';
    input = h('input', { id, name, type: 'number', step, min, max, required, 'aria-describedby': described, inputMode: kind === 'integer' ? 'numeric' : 'decimal' });
    if (def !== undefined) input.value = text(def);
    let box = input;
    if (typeof min === 'number' && typeof max === 'number' && max - min <= 100000) {
      const slider = h('input', { type: 'range', min, max, step: kind === 'integer' ? 1 : (max - min) / 100, 'aria-label': name + ' slider', tabIndex: -1 });
      slider.value = def === undefined ? min : text(def);
      slider.addEventListener('input', () => { input.value = slider.value; err.textContent = ''; });
      input.addEventListener('input', () => { if (input.value !== '') slider.value = input.value; });
      box = h('div', { class: 'range' }, slider, input);
    }
    const num = input;
    get = () => {
      if (num.value === '') {
        if (num.validity.badInput) { err.textContent = 'Not a number'; throw new Error('number'); }
        return undefined;
      }
      const v = kind === 'integer' ? exactInteger(num.value) : Number(num.value);
      if (typeof v === 'number' && !Number.isFinite(v)) { err.textContent = 'Not a number'; throw new Error('number'); }
      return v;
    };
    input = box;
  } else if (kind === 'enum') {
    input = h('select', { id, name, required, 'aria-describedby': described },
      required ? null : h('option', { value: '' }, '—'),
      s.enum.map((v, i) => h('option', { value: String(i) }, text(v))));
    const at = def === undefined ? -1 : s.enum.findIndex((v) => typeof v === typeof def && text(v) === text(def));
    if (at >= 0) input.value = String(at);
    get = () => (input.value === '' ? undefined : s.enum[Number(input.value)]);
  } else if (kind === 'boolean') {
    const box = h('input', { id, name, type: 'checkbox', role: 'switch', 'aria-describedby': described });
    box.checked = def === true;
    input = h('span', { class: 'switch' }, box, h('span', { class: 'muted', text: 'on/off' }));
    // A box never touched and not required is left out, so the device's default applies.
    let touched = required || def !== undefined;
    box.addEventListener('change', () => (touched = true));
    get = () => (touched ? box.checked : undefined);
  } else if (kind === 'string') {
    const long = s.maxLength === undefined || s.maxLength > 200;
    input = h(long && s.format !== 'uri' ? 'textarea' : 'input', { id, name, type: 'text', required, maxLength: s.maxLength, 'aria-describedby': described, rows: 2 });
    if (def !== undefined) input.value = text(def);
    get = () => (input.value === '' && !required ? undefined : input.value);
  } else {
    const want = s && s.type;
    input = h('textarea', { id, name, spellcheck: 'false', 'aria-describedby': described, placeholder: want === 'array' ? '[]' : want === 'object' ? '{}' : 'JSON' });
    if (def !== undefined) input.value = JSON.stringify(def, null, 2);
    const check = () => {
      if (input.value.trim() === '') { err.textContent = ''; return undefined; }
      let v;
      try { v = parseExact(input.value); } catch (e) { err.textContent = 'Not valid JSON: ' + e.message; throw e; }
      if (want === 'array' && !Array.isArray(v)) { err.textContent = 'Want a JSON array'; throw new Error('type'); }
      if (want === 'object' && (v === null || typeof v !== 'object' || Array.isArray(v) || JSON.isRawJSON?.(v))) { err.textContent = 'Want a JSON object'; throw new Error('type'); }
      err.textContent = '';
      return v;
    };
    input.addEventListener('input', () => { try { check(); } catch {} });
    get = check;
  }
  const wrap = h('div', { class: 'field' }, label, hintId ? h('p', { class: 'hint', id: hintId, text: s.description }) : null, input, err);
  return { name, wrap, err, get, required };
}

// schemaForm returns {el, values(), showProblems(problems), clear()}.
// values() throws when a JSON editor holds invalid JSON (shown at the field).
export function schemaForm(schema) {
  const props = (schema && schema.properties) || {};
  const req = new Set((schema && schema.required) || []);
  const fields = Object.entries(props).map(([n, s]) => field(n, s, req.has(n)));
  const top = h('p', { class: 'fielderr', 'aria-live': 'polite' });
  const el = h('div', {}, fields.length ? fields.map((f) => f.wrap) : h('p', { class: 'muted', text: 'No arguments.' }), top);
  return {
    el,
    fields,
    values() {
      const out = {};
      let bad = false;
      for (const f of fields) {
        try {
          const v = f.get();
          if (v !== undefined) out[f.name] = v;
        } catch { bad = true; }
      }
      if (bad) throw new Error('fix the fields marked in red');
      return out;
    },
    clear() { top.textContent = ''; for (const f of fields) f.err.textContent = ''; },
    // showProblems puts each problem next to the field its path names
    // (/volume, /person/address/street → person), the rest on top.
    showProblems(problems) {
      const rest = [];
      const all = [];
      for (const p of problems || []) {
        // "missing properties 'a', 'b'" names several fields: one each.
        const names = !p.path && /^missing propert(?:y|ies) /.test(p.message || '') ? [...p.message.matchAll(/'([^']+)'/g)].map((m) => m[1]) : [];
        if (names.length) for (const n of names) all.push({ name: n, p: { path: '', message: 'missing property ' + "'" + n + "'" } });
        else all.push({ p });
      }
      for (const { name: missing, p } of all) {
        let first = (p.path || '').split('/')[1];
        if (missing) first = missing;
        const name = first === undefined ? undefined : first.replace(/~1/g, '/').replace(/~0/g, '~');
        const f = fields.find((x) => x.name === name);
        const msg = (p.path && f && p.path !== '/' + first ? p.path + ': ' : '') + p.message;
        if (f) f.err.textContent = f.err.textContent ? f.err.textContent + '; ' + msg : msg;
        else rest.push((p.path ? p.path + ': ' : '') + p.message);
      }
      top.textContent = rest.join('; ');
    },
  };
}
