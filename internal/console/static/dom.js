// h builds an element: h('p', {class: 'x', onclick: f}, 'text', child...).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k in el && typeof v !== 'string') el[k] = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false) el.append(c);
  return el;
}

export function ago(t) {
  if (!t) return '';
  const s = (Date.now() - Date.parse(t)) / 1000;
  if (s < 5) return 'now';
  if (s < 60) return Math.round(s) + ' s ago';
  if (s < 3600) return Math.round(s / 60) + ' min ago';
  if (s < 86400) return Math.round(s / 3600) + ' h ago';
  return new Date(t).toLocaleString();
}

export function when(t) { return t ? new Date(t).toLocaleString() : ''; }

let seq = 0;
export const uid = (p) => `${p}-${++seq}`;

export async function copy(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    flash(button, 'Copied');
  } catch {
    window.prompt('Copy:', text); // no clipboard off a secure origin
  }
}

function flash(button, text) {
  if (!button) return;
  const old = button.textContent;
  button.textContent = text;
  setTimeout(() => (button.textContent = old), 1200);
}
