package console_test

import (
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// TestConsoleSchemaForm drives the form generated from a tool's schema in
// Chromium: exclusive bounds (JSON Schema 6 and later, and draft 4's true
// beside minimum) are kept out of the box's and the slider's range and a
// value on them is marked before sending, as the gateway would refuse it; a
// const is a read-only box that is always sent; a required field left empty
// is marked, not sent as "".
func TestConsoleSchemaForm(t *testing.T) {
	ctx := browser(t, 1280, 900)
	gw := startGateway(t, gateway.Config{})
	run(t, ctx, "open the console", chromedp.Navigate("http://"+gw.Addr()+"/"))
	waitJS(t, ctx, "the console", `!!document.querySelector('#devices')`)

	// fill builds the form of schema (read as the device page reads it:
	// big integers exact), sets each named box, and answers what values()
	// sends or, when it refuses, each field's message and aria-invalid.
	const fill = `(schema, set) => Promise.all([import('/console/json.js'), import('/console/form.js')]).then(([j, f]) => {
		const form = f.schemaForm(j.parseExact(schema));
		document.getElementById('main').append(form.el);
		for (const [n, v] of Object.entries(set)) form.el.querySelector('[name="' + n + '"]').value = v;
		try { return JSON.stringify(form.values()); }
		catch { return form.fields.map((x) => x.name + ': ' + x.err.textContent + (x.control.getAttribute('aria-invalid') === 'true' ? ' (invalid)' : '')).join(' | '); }
		finally { form.el.remove(); }
	})`
	for _, tc := range []struct {
		name, schema, set, want string
	}{
		{"integer on its exclusive minimum", `{"properties":{"n":{"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10}}}`, `{n: '0'}`, "n: Must be more than 0 (invalid)"},
		{"integer on its exclusive maximum", `{"properties":{"n":{"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10}}}`, `{n: '10'}`, "n: Must be less than 10 (invalid)"},
		{"integer inside exclusive bounds", `{"properties":{"n":{"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10}}}`, `{n: '1'}`, `{"n":1}`},
		{"number on its exclusive minimum", `{"properties":{"x":{"type":"number","exclusiveMinimum":0,"maximum":1}}}`, `{x: '0'}`, "x: Must be more than 0 (invalid)"},
		{"number inside", `{"properties":{"x":{"type":"number","exclusiveMinimum":0,"maximum":1}}}`, `{x: '0.01'}`, `{"x":0.01}`},
		{"draft 4's exclusiveMinimum true", `{"properties":{"n":{"type":"integer","minimum":0,"exclusiveMinimum":true}}}`, `{n: '0'}`, "n: Must be more than 0 (invalid)"},
		{"draft 4's exclusiveMaximum false", `{"properties":{"n":{"type":"integer","maximum":5,"exclusiveMaximum":false}}}`, `{n: '5'}`, `{"n":5}`},
		{"a big exclusive maximum", `{"properties":{"n":{"type":"integer","exclusiveMaximum":9007199254740993}}}`, `{n: '9007199254740993'}`, "n: Must be less than 9007199254740993 (invalid)"},
		{"below a big exclusive maximum", `{"properties":{"n":{"type":"integer","exclusiveMaximum":9007199254740993}}}`, `{n: '9007199254740992'}`, `{"n":9007199254740992}`},
		{"a const string", `{"required":["mode"],"properties":{"mode":{"type":"string","const":"on"},"v":{"type":"integer"}}}`, `{}`, `{"mode":"on"}`},
		{"a const object and number", `{"properties":{"o":{"const":{"a":[1,2]}},"n":{"const":12345678901234567891}}}`, `{}`, `{"o":{"a":[1,2]},"n":12345678901234567891}`},
		{"a required string left empty", `{"required":["text"],"properties":{"text":{"type":"string","maxLength":50},"note":{"type":"string"}}}`, `{}`, "text: Required (invalid) | note: "},
		{"a required string filled", `{"required":["text"],"properties":{"text":{"type":"string","maxLength":50},"note":{"type":"string"}}}`, `{text: 'hi'}`, `{"text":"hi"}`},
		{"required number and JSON left empty", `{"required":["n","o"],"properties":{"n":{"type":"integer"},"o":{"type":"object"}}}`, `{}`, "n: Required (invalid) | o: Required (invalid)"},
		// A device's schema may be malformed (the gateway passes it on): a
		// keyword of the wrong type or range is ignored.
		{"required not an array", `{"required":7,"properties":{"a":{"type":"string"}}}`, `{a: 'x'}`, `{"a":"x"}`},
		{"a negative maxLength", `{"properties":{"a":{"type":"string","maxLength":-1}}}`, `{a: 'x'}`, `{"a":"x"}`},
		{"a maxLength beyond the DOM's", `{"properties":{"a":{"type":"string","maxLength":12345678901234}}}`, `{a: 'x'}`, `{"a":"x"}`},
		{"a property schema not an object", `{"properties":{"a":7,"b":{"type":"integer","minimum":"x","description":5}}}`, `{b: '3'}`, `{"b":3}`},
		{"properties an array", `{"required":[1,{}],"properties":[1,2]}`, `{}`, `{}`},
	} {
		got := eval[string](t, ctx, "("+fill+")("+jsString(tc.schema)+", "+tc.set+")")
		if got != tc.want {
			t.Errorf("%s: %s with %s gives %q, want %q", tc.name, tc.schema, tc.set, got, tc.want)
		}
	}

	// The boxes and sliders offer only what the bounds allow; a const is
	// shown read-only.
	const attrs = `(schema) => import('/console/form.js').then((f) => {
		const el = f.schemaForm(JSON.parse(schema)).el;
		const box = el.querySelector('input[type=number], input[type=text]'), slider = el.querySelector('input[type=range]');
		return [box.min, box.max, slider ? slider.min + '..' + slider.max : '-', box.readOnly ? 'readonly ' + box.value : ''].join(' ');
	})`
	for schema, want := range map[string]string{
		`{"properties":{"n":{"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10}}}`:      "1 9 1..9 ",
		`{"properties":{"n":{"type":"integer","minimum":2,"exclusiveMinimum":0,"maximum":8}}}`:    "2 8 2..8 ",
		`{"properties":{"n":{"type":"integer","minimum":0,"exclusiveMinimum":true,"maximum":9}}}`: "1 9 1..9 ",
		`{"properties":{"n":{"type":"integer","exclusiveMinimum":0.5,"exclusiveMaximum":3.5}}}`:   "1 3 1..3 ",
		`{"properties":{"x":{"type":"number","exclusiveMinimum":0,"maximum":1}}}`:                 "0 1 0.01..1 ",
		`{"properties":{"c":{"type":"string","const":"fixed"}}}`:                                  "  - readonly fixed",
	} {
		if got := eval[string](t, ctx, "("+attrs+")("+jsString(schema)+")"); got != want {
			t.Errorf("%s: box min, max, slider, const: %q, want %q", schema, got, want)
		}
	}
}

// TestConsoleFormSlider: moving a number's slider sets its box, and the
// call sends that value.
func TestConsoleFormSlider(t *testing.T) {
	ctx := browser(t, 1280, 900)
	gw := startGateway(t, gateway.Config{})
	run(t, ctx, "open the console", chromedp.Navigate("http://"+gw.Addr()+"/"))
	waitJS(t, ctx, "the console", `!!document.querySelector('#devices')`)
	got := eval[string](t, ctx, `import('/console/form.js').then((f) => {
		const form = f.schemaForm({type: 'object', properties: {volume: {type: 'integer', minimum: 0, maximum: 100}}});
		const slider = form.el.querySelector('input[type=range]');
		slider.value = '40';
		slider.dispatchEvent(new Event('input'));
		return form.el.querySelector('input[type=number]').value + ' ' + JSON.stringify(form.values());
	})`)
	if got != `40 {"volume":40}` {
		t.Errorf("after moving the slider to 40: box and values %s", got)
	}
}

// TestConsoleMalformedSchemas: on a device's page, tools whose schemas are
// malformed (required not an array, a negative maxLength) get their form
// like any other, and a form that cannot be built falls back to a JSON box
// for that tool's arguments: no tool hides the others.
func TestConsoleMalformedSchemas(t *testing.T) {
	ctx := browser(t, 1280, 900)
	gw := startGateway(t, gateway.Config{})
	d, _ := simDevice(t, gw, device.ProfileESP32, 1)
	waitState(t, gw, d.MAC, hub.StateReady)
	run(t, ctx, "open the console", chromedp.Navigate("http://"+gw.Addr()+"/#/devices"))
	waitJS(t, ctx, "the device", rowState(d.MAC)+` === 'ready'`)
	// The gateway relays what devices write: the page is given, beside the
	// device's own tools, those a hostile device could send.
	do(t, ctx, `const f = window.fetch; window.fetch = async (u, o) => {
		const r = await f(u, o);
		if (!/^\/api\/v1\/devices\/[^/]+\/tools$/.test(String(u))) return r;
		const b = await r.json();
		b.tools.push({name: 'bad.required', inputSchema: {type: 'object', properties: {a: {type: 'string'}}, required: 7}},
			{name: 'bad.maxlength', inputSchema: {type: 'object', properties: {b: {type: 'string', maxLength: -1}}}});
		return new Response(JSON.stringify(b), {headers: {'Content-Type': 'application/json'}});
	}; location.hash = '#/device/`+d.MAC+`'`)
	card := func(name string) string { return `document.querySelector('details[data-tool="` + name + `"]')` }
	waitJS(t, ctx, "the tools", card("bad.maxlength")+` !== null`)
	for _, c := range []struct{ tool, field string }{{"self.audio_speaker.set_volume", "volume"}, {"bad.required", "a"}, {"bad.maxlength", "b"}} {
		if !eval[bool](t, ctx, card(c.tool)+`.querySelector('[name="`+c.field+`"]') !== null`) {
			t.Errorf("tool %s has no field %s: %s", c.tool, c.field, eval[string](t, ctx, card(c.tool)+`.innerText`))
		}
	}
	if errs := eval[string](t, ctx, `[...document.querySelectorAll('#tools .result.error')].map((e) => e.innerText).join(' | ')`); errs != "" {
		t.Errorf("the tools section shows errors: %s", errs)
	}
	checkPage(t, ctx, "device")

	// The fallback form: the arguments as one JSON object.
	got := eval[string](t, ctx, `import('/console/form.js').then((f) => {
		const form = f.jsonForm('why');
		const box = form.el.querySelector('textarea'), out = [form.el.querySelector('.hint').textContent, JSON.stringify(form.values())];
		box.value = '{"x": [1]}';
		out.push(JSON.stringify(form.values()));
		box.value = '[1]';
		try { form.values(); } catch { out.push(form.fields[0].err.textContent); }
		return out.join(' ');
	})`)
	if want := `why {} {"x":[1]} Want a JSON object`; got != want {
		t.Errorf("the JSON form: %q, want %q", got, want)
	}
}
