// A form generated from a tool's inputSchema: numbers with a range as a
// slider and a number box, enums as a select, booleans as a switch, strings
// as a text box, a const as a read-only box holding it, anything else
// (objects, arrays, unions) as a JSON editor checked as it is typed. A
// required field left empty, and a number on or past an exclusive bound, are
// marked before anything is sent; gateway invalid_arguments problems are
// shown next to the field their JSON pointer names.
import { h, uid } from './dom.js';
import { parseExact, exactInteger } from './json.js';

// A schema read exactly (api's exact) keeps an integer beyond 2^53 as a raw
// JSON value: text shows it as written.
const isRaw = (v) => !!JSON.isRawJSON?.(v);
const text = (v) => (isRaw(v) ? v.rawJSON : String(v));

// A device writes its schemas and the gateway passes them on unchecked: a
// keyword of the wrong type or range is ignored, never thrown on.
const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v) && !isRaw(v);
const length = (v) => (Number.isSafeInteger(v) && v >= 0 && v <= 0x7fffffff ? v : undefined); // what the DOM takes

function typeOf(s) {
  if (!s) return 'json';
  if (Object.hasOwn(s, 'const')) return 'const';
  if (Array.isArray(s.enum) && s.enum.length && s.enum.every((v) => ['string', 'number', 'boolean'].includes(typeof v) || isRaw(v))) return 'enum';
  let t = s.type;
  if (Array.isArray(t)) t = t.filter((x) => x !== 'null').length === 1 ? t.find((x) => x !== 'null') : null;
  if (t === 'integer' || t === 'number' || t === 'boolean' || t === 'string') return t;
  return 'json';
}

// cmp compares two numbers given as text or numbers (-1, 0, 1), exactly
// when both are integers: a bound may be beyond 2^53.
function cmp(a, b) {
  const x = String(a).trim(), y = String(b).trim();
  if (/^-?\d+$/.test(x) && /^-?\d+$/.test(y)) {
    const d = BigInt(x) - BigInt(y);
    return d < 0n ? -1 : d > 0n ? 1 : 0;
  }
  return Math.sign(Number(x) - Number(y));
}

// inside is the first integer inside an exclusive bound given as text or a
// number: above it (by 1) or below it (by -1), exactly for big integers.
function inside(v, by) {
  const t = String(v).trim();
  if (!/^-?\d+$/.test(t)) return by > 0 ? Math.floor(Number(t)) + 1 : Math.ceil(Number(t)) - 1;
  const n = BigInt(t) + BigInt(by);
  return Number.isSafeInteger(Number(n)) ? Number(n) : String(n);
}

function field(name, s, required) {
  if (!isObject(s)) s = undefined;
  const id = uid('f');
  const errId = id + '-err';
  const kind = typeOf(s);
  const hintId = s && typeof s.description === 'string' && s.description ? id + '-hint' : null;
  const described = [hintId, errId].filter(Boolean).join(' ');
  const label = h('label', { for: id }, name, required ? h('span', { 'aria-hidden': 'true' }, ' *') : '', ' ',
    h('span', { class: 'muted', text: kind === 'json' ? (s && s.type ? String(s.type) : 'JSON') : kind }));
  const err = h('p', { class: 'fielderr', id: errId, 'aria-live': 'polite' });
  let input, get, control; // control: the element that takes focus
  const def = s && s.default;
  if (kind === 'const') {
    // One value is allowed: shown, not editable, always sent.
    const v = s.const;
    const shown = typeof v === 'string' ? v : isRaw(v) ? v.rawJSON : JSON.stringify(v);
    input = h('input', { id, name, type: 'text', readOnly: true, value: shown, 'aria-describedby': described });
    control = input;
    get = () => v;
  } else if (kind === 'integer' || kind === 'number') {
    const bound = (v) => (typeof v === 'number' ? v : isRaw(v) ? v.rawJSON : undefined);
    // An exclusive bound is a number (JSON Schema 6 and later) or, in
    // draft 4, true beside minimum or maximum, which it makes exclusive.
    const xmin = s.exclusiveMinimum === true ? bound(s.minimum) : bound(s.exclusiveMinimum);
    const xmax = s.exclusiveMaximum === true ? bound(s.maximum) : bound(s.exclusiveMaximum);
    const imin = s.exclusiveMinimum === true ? undefined : bound(s.minimum);
    const imax = s.exclusiveMaximum === true ? undefined : bound(s.maximum);
    // The box's and the slider's range, inclusive: an integer's exclusive
    // bound moves in by one; the tighter of two bounds wins.
    const tight = (a, b, lower) => (a === undefined ? b : b === undefined ? a : (cmp(a, b) > 0) === lower ? a : b);
    const min = tight(imin, kind === 'integer' && xmin !== undefined ? inside(xmin, 1) : xmin, true);
    const max = tight(imax, kind === 'integer' && xmax !== undefined ? inside(xmax, -1) : xmax, false);
    const inc = kind === 'integer' ? 1 : 'any';
    input = h('input', { id, name, type: 'number', step: inc, min, max, required, 'aria-describedby': described, inputMode: kind === 'integer' ? 'numeric' : 'decimal' });
    if (def !== undefined) input.value = text(def);
    const num = input;
    control = num;
    let box = num;
    if (typeof min === 'number' && typeof max === 'number' && max - min <= 100000 && max > min) {
      const by = kind === 'integer' ? 1 : (max - min) / 100;
      // A number's slider stops a step short of an exclusive bound.
      const smin = xmin !== undefined && cmp(min, xmin) === 0 ? min + by : min;
      const smax = xmax !== undefined && cmp(max, xmax) === 0 ? max - by : max;
      const slider = h('input', { type: 'range', min: smin, max: smax, step: by, 'aria-label': name + ' slider', tabIndex: -1 });
      slider.value = def === undefined ? smin : text(def);
      slider.addEventListener('input', () => { num.value = slider.value; err.textContent = ''; });
      num.addEventListener('input', () => { if (num.value !== '') slider.value = num.value; });
      box = h('div', { class: 'range' }, slider, num);
    }
    get = () => {
      if (num.value === '') {
        if (num.validity.badInput) { err.textContent = 'Not a number'; throw new Error('number'); }
        return undefined;
      }
      const v = kind === 'integer' ? exactInteger(num.value) : Number(num.value);
      if (typeof v === 'number' && !Number.isFinite(v)) { err.textContent = 'Not a number'; throw new Error('number'); }
      // The gateway refuses a value on an exclusive bound: say so here.
      if (xmin !== undefined && cmp(num.value, xmin) <= 0) { err.textContent = `Must be more than ${xmin}`; throw new Error('range'); }
      if (xmax !== undefined && cmp(num.value, xmax) >= 0) { err.textContent = `Must be less than ${xmax}`; throw new Error('range'); }
      return v;
    };
    input = box;
  } else if (kind === 'enum') {
    input = h('select', { id, name, required, 'aria-describedby': described },
      required ? null : h('option', { value: '' }, '—'),
      s.enum.map((v, i) => h('option', { value: String(i) }, text(v))));
    const at = def === undefined ? -1 : s.enum.findIndex((v) => typeof v === typeof def && text(v) === text(def));
    if (at >= 0) input.value = String(at);
    control = input;
    get = () => (input.value === '' ? undefined : s.enum[Number(input.value)]);
  } else if (kind === 'boolean') {
    const box = h('input', { id, name, type: 'checkbox', role: 'switch', 'aria-describedby': described });
    box.checked = def === true;
    control = box;
    input = h('span', { class: 'switch' }, box, h('span', { class: 'muted', text: 'on/off' }));
    // A box never touched and not required is left out, so the device's default applies.
    let touched = required || def !== undefined;
    box.addEventListener('change', () => (touched = true));
    get = () => (touched ? box.checked : undefined);
  } else if (kind === 'string') {
    const maxLength = length(s.maxLength);
    const long = maxLength === undefined || maxLength > 200;
    input = h(long && s.format !== 'uri' ? 'textarea' : 'input', { id, name, type: 'text', required, maxLength, 'aria-describedby': described, rows: 2 });
    if (def !== undefined) input.value = text(def);
    control = input;
    // Empty is left out: a required box left empty is marked by values().
    get = () => (input.value === '' ? undefined : input.value);
  } else {
    const want = s && s.type;
    input = h('textarea', { id, name, spellcheck: 'false', 'aria-describedby': described, placeholder: want === 'array' ? '[]' : want === 'object' ? '{}' : 'JSON' });
    if (def !== undefined) input.value = JSON.stringify(def, null, 2);
    control = input;
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
  return { name, wrap, err, get, required, control };
}

function invalid(f, bad) {
  if (bad) f.control.setAttribute('aria-invalid', 'true');
  else f.control.removeAttribute('aria-invalid');
}

// schemaForm returns {el, values(), showProblems(problems), clear()}.
// values() throws, marking the fields, when a required field is empty, a
// number is out of an exclusive bound or a JSON editor holds invalid JSON.
export function schemaForm(schema) {
  const props = isObject(schema) && isObject(schema.properties) ? schema.properties : {};
  const req = new Set(isObject(schema) && Array.isArray(schema.required) ? schema.required : []);
  return form(Object.entries(props).map(([n, s]) => field(n, s, req.has(n))));
}

// jsonForm is the form of a tool whose schema makes none: its arguments
// as one JSON object, and why.
export function jsonForm(why) {
  const f = field('arguments', { type: 'object', description: why });
  return form([f], f);
}

// form gathers fields; whole, when given, is the one field that holds
// every argument.
function form(fields, whole) {
  const top = h('p', { class: 'fielderr', 'aria-live': 'polite' });
  const el = h('div', {}, fields.length ? fields.map((f) => f.wrap) : h('p', { class: 'muted', text: 'No arguments.' }), top);
  return {
    el,
    fields,
    values() {
      const out = {};
      let first = null;
      for (const f of fields) {
        let ok = true;
        try {
          const v = f.get();
          if (v !== undefined) out[f.name] = v;
          else if (f.required) { f.err.textContent = 'Required'; ok = false; }
        } catch { ok = false; }
        invalid(f, !ok);
        if (!ok) first ||= f;
      }
      if (first) {
        first.control.focus();
        throw new Error('fix the fields marked in red');
      }
      return whole ? out.arguments ?? {} : out;
    },
    clear() { top.textContent = ''; for (const f of fields) { f.err.textContent = ''; invalid(f, false); } },
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
        const f = whole ? undefined : fields.find((x) => x.name === name);
        const msg = (p.path && f && p.path !== '/' + first ? p.path + ': ' : '') + p.message;
        if (f) { f.err.textContent = f.err.textContent ? f.err.textContent + '; ' + msg : msg; invalid(f, true); }
        else rest.push((p.path ? p.path + ': ' : '') + p.message);
      }
      top.textContent = rest.join('; ');
    },
  };
}
