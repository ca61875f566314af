// JSON as written: JSON.parse rounds integers beyond 2^53 (ids, counters,
// nanosecond times), so the console would show, and send back, numbers
// nobody wrote. Where the browser has JSON.rawJSON such an integer is kept
// as its text, and JSON.stringify writes it out unchanged.

const keep = (_, v, ctx) =>
  typeof v === 'number' && !Number.isSafeInteger(v) && ctx && /^-?\d+$/.test(ctx.source) && JSON.rawJSON
    ? JSON.rawJSON(ctx.source)
    : v;

// parseExact is JSON.parse keeping big integers.
export const parseExact = (text) => JSON.parse(text, keep);

// exactInteger turns the text of an integer box into the value to send.
export function exactInteger(text) {
  const v = Number(text);
  return !Number.isSafeInteger(v) && /^-?\d+$/.test(text.trim()) && JSON.rawJSON ? JSON.rawJSON(text.trim()) : v;
}
