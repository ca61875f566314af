package hub

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// Catalog is one distinct tool list with its compiled input schemas. A fleet
// runs a handful of firmware builds, so catalogs are interned by content hash:
// devices with identical tools share one Catalog. A Catalog is immutable.
type Catalog struct {
	Hash  string
	Tools []mcpclient.Tool

	byName  map[string]int
	schemas []*jsonschema.Schema // nil where a schema was absent or did not compile
	refs    int                  // guarded by catalogs.mu
}

// Tool returns the tool with the given name.
func (c *Catalog) Tool(name string) (*mcpclient.Tool, bool) {
	if c == nil {
		return nil, false
	}
	i, ok := c.byName[name]
	if !ok {
		return nil, false
	}
	return &c.Tools[i], true
}

// Len returns the number of tools; 0 for a nil catalog.
func (c *Catalog) Len() int {
	if c == nil {
		return 0
	}
	return len(c.Tools)
}

// catalogHash hashes tools in order by their raw JSON.
func catalogHash(tools []mcpclient.Tool) string {
	h := sha256.New()
	for _, t := range tools {
		raw := t.Raw
		if raw == nil {
			raw, _ = json.Marshal(t)
		}
		if !jsonscan.Compact(raw) { // devices send compact JSON: usually nothing to do
			var buf bytes.Buffer
			if json.Compact(&buf, raw) == nil {
				raw = buf.Bytes()
			}
		}
		fmt.Fprintf(h, "%d:", len(raw))
		h.Write(raw)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// catalogs interns Catalogs by hash and counts the devices that use each.
type catalogs struct {
	log *slog.Logger

	mu     sync.Mutex
	byHash map[string]*Catalog // guarded by mu
}

func newCatalogs(log *slog.Logger) *catalogs {
	return &catalogs{log: log, byHash: make(map[string]*Catalog)}
}

// acquire returns the interned catalog of tools, compiling it on first sight,
// and counts one more user of it. device is the device the tools came from,
// named in what compiling logs (the first device of a shared catalog).
func (cs *catalogs) acquire(device string, tools []mcpclient.Tool) *Catalog {
	hash := catalogHash(tools)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c, ok := cs.byHash[hash]; ok {
		c.refs++
		return c
	}
	c := &Catalog{Hash: hash, Tools: tools, byName: make(map[string]int, len(tools)), schemas: make([]*jsonschema.Schema, len(tools))}
	for i, t := range tools {
		c.byName[t.Name] = i
		sch, err := CompileSchema(t.InputSchema)
		if err != nil {
			// The device still validates; the gateway just cannot pre-check.
			cs.log.Warn("tool input schema does not compile; arguments will not be pre-validated",
				"device_id", device, "tool", t.Name, "catalog_hash", hash, "error", err)
		}
		c.schemas[i] = sch
	}
	c.refs = 1
	cs.byHash[hash] = c
	return c
}

// release drops one user of c, forgetting it when none is left.
func (cs *catalogs) release(c *Catalog) {
	if c == nil {
		return
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c.refs--
	if c.refs <= 0 {
		delete(cs.byHash, c.Hash)
	}
}

func (cs *catalogs) count() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.byHash)
}

var errNoLoader = errors.New("external schema references are not loaded")

// refusingLoader keeps a device's schema from making the gateway read files or
// URLs through $ref.
type refusingLoader struct{}

func (refusingLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%w: %s", errNoLoader, url)
}

// CompileSchema compiles a tool's input or output schema as the hub does:
// JSON Schema 2020-12 unless its $schema names another draft, no $ref
// outside the schema loaded, at most 64 levels deep. A missing or null
// schema is nil, without error. "format" is an annotation, as 2020-12 says
// (drafts before 2019-09 assert it).
func CompileSchema(raw json.RawMessage) (*jsonschema.Schema, error) {
	return compileSchema(raw, false)
}

// CompileOutputSchema compiles a tool's outputSchema as CompileSchema does,
// but asserting "format" as SDK clients check a result's structuredContent:
// with ajv-formats' own definitions (formats.go), as the TypeScript SDK's
// Ajv does, so {"a":"a@b"} fails an "email". Formats ajv-formats does not
// know, which Ajv ignores, stay annotations; a "regex" RE2 cannot compile
// passes (see compileSchema).
func CompileOutputSchema(raw json.RawMessage) (*jsonschema.Schema, error) {
	return compileSchema(raw, true)
}

func compileSchema(raw json.RawMessage, assertFormat bool) (*jsonschema.Schema, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if d := schemaDepth(raw); d > maxSchemaDepth {
		return nil, fmt.Errorf("schema nested %d levels deep, more than %d", d, maxSchemaDepth)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("parse schema: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(refusingLoader{})
	// One regexp engine compiles "pattern" with the schema and checks the
	// "regex" format of an instance after. JSON Schema means ECMA-262, which
	// RE2 only partly reads: a schema's pattern RE2 cannot compile still
	// fails the schema, but an instance's regex it cannot compile
	// (lookahead, backreference) is unknown, not invalid.
	var compiled atomic.Bool
	c.UseRegexpEngine(func(s string) (jsonschema.Regexp, error) {
		re, err := regexp.Compile(s)
		if err != nil && compiled.Load() {
			return nil, nil
		}
		return re, err
	})
	if assertFormat {
		c.AssertFormat()
		registerAjvFormats(c)
	}
	const loc = "mcpgate:///tool-schema.json"
	if err := c.AddResource(loc, doc); err != nil {
		return nil, fmt.Errorf("add schema: %w", err)
	}
	sch, err := c.Compile(loc)
	if err != nil {
		return nil, fmt.Errorf("compile schema: %w", err)
	}
	compiled.Store(true)
	return sch, nil
}

// maxProblems bounds what one validation reports: a schema with many
// alternatives (anyOf over dozens of objects) could otherwise yield an error
// message of every branch's every property.
const maxProblems = 20

// addCauses adds the innermost causes under e to verr: with $ref, allOf or
// anyOf in the way, e's own message is only "validation failed" and the
// reason (got number, want string) is a cause a few levels down.
func addCauses(verr *ValidationError, e *jsonschema.ValidationError, pr *message.Printer, seen map[Problem]bool) {
	if len(e.Causes) > 0 {
		for _, c := range e.Causes {
			addCauses(verr, c, pr, seen)
		}
		return
	}
	p := Problem{Path: instancePath(e.InstanceLocation), Message: problemMessage(e.ErrorKind, pr)}
	if seen[p] {
		return
	}
	seen[p] = true
	switch n := len(verr.Problems); {
	case n < maxProblems:
		verr.Problems = append(verr.Problems, p)
	case n == maxProblems:
		verr.Problems = append(verr.Problems, Problem{Message: "and more"})
	}
}

// problemMessage is the validator's message for k, with numbers as JSON
// writes them: its printer rounds an integer past 2^53 to a float
// ("1.2345678901234567×10¹⁹") and groups digits ("123,456").
func problemMessage(k jsonschema.ErrorKind, pr *message.Printer) string {
	switch k := k.(type) {
	case *kind.Minimum:
		return bound("minimum", k.Got, k.Want)
	case *kind.Maximum:
		return bound("maximum", k.Got, k.Want)
	case *kind.ExclusiveMinimum:
		return bound("exclusiveMinimum", k.Got, k.Want)
	case *kind.ExclusiveMaximum:
		return bound("exclusiveMaximum", k.Got, k.Want)
	case *kind.MultipleOf:
		return bound("multipleOf", k.Got, k.Want)
	case *kind.MinLength:
		return fmt.Sprintf("minLength: got %d, want %d", k.Got, k.Want)
	case *kind.MaxLength:
		return fmt.Sprintf("maxLength: got %d, want %d", k.Got, k.Want)
	case *kind.MinItems:
		return fmt.Sprintf("minItems: got %d, want %d", k.Got, k.Want)
	case *kind.MaxItems:
		return fmt.Sprintf("maxItems: got %d, want %d", k.Got, k.Want)
	case *kind.MinProperties:
		return fmt.Sprintf("minProperties: got %d, want %d", k.Got, k.Want)
	case *kind.MaxProperties:
		return fmt.Sprintf("maxProperties: got %d, want %d", k.Got, k.Want)
	}
	return k.LocalizedString(pr)
}

func bound(keyword string, got, want *big.Rat) string {
	return keyword + ": got " + ratString(got) + ", want " + ratString(want)
}

// ratString writes an integer of up to 30 digits exactly (an id, a
// timestamp in nanoseconds), any other number as the shortest decimal that
// reads back as the same float64 (1e+300, not its 301 digits).
func ratString(r *big.Rat) string {
	if r == nil {
		return "?"
	}
	if r.IsInt() {
		if s := r.Num().String(); len(s) <= 30 {
			return s
		}
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// instancePath is a JSON pointer to where in the arguments a problem is.
func instancePath(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1"))
	}
	return b.String()
}

// validate checks args (a JSON object) against tool i's schema.
func (c *Catalog) validate(i int, args json.RawMessage) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return &ValidationError{Tool: c.Tools[i].Name, Problems: []Problem{{Message: "arguments are not valid JSON: " + err.Error()}}}
	}
	if _, ok := inst.(map[string]any); !ok {
		return &ValidationError{Tool: c.Tools[i].Name, Problems: []Problem{{Message: "arguments must be a JSON object"}}}
	}
	// Checked even without a schema: the arguments are sent as written, and
	// a device's cJSON reads the first of two members of a name where the
	// schema check, the audit and the tool's policy read the last.
	if path, earlier, found := jsonscan.Repeated(args); found {
		return &ValidationError{Tool: c.Tools[i].Name, Problems: []Problem{{Path: instancePath(path), Message: repeatedMessage(path[len(path)-1], earlier)}}}
	}
	sch := c.schemas[i]
	if sch == nil {
		return nil
	}
	if problems := schemaProblems(sch, inst); problems != nil {
		return &ValidationError{Tool: c.Tools[i].Name, Problems: problems}
	}
	return nil
}

// SchemaProblems validates doc (JSON) against sch and returns what is wrong,
// as [ValidationError] reports it; nil when doc is valid.
func SchemaProblems(sch *jsonschema.Schema, doc json.RawMessage) []Problem {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return []Problem{{Message: "not valid JSON: " + err.Error()}}
	}
	return schemaProblems(sch, inst)
}

func schemaProblems(sch *jsonschema.Schema, inst any) []Problem {
	err := sch.Validate(inst)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return []Problem{{Message: err.Error()}}
	}
	verr := &ValidationError{}
	addCauses(verr, ve, message.NewPrinter(language.English), make(map[Problem]bool))
	if len(verr.Problems) == 0 {
		return []Problem{{Message: ve.Error()}}
	}
	return verr.Problems
}

// repeatedMessage says that the member name is written twice in one object.
func repeatedMessage(name, earlier string) string {
	if name == earlier {
		return fmt.Sprintf("key %q is repeated", name)
	}
	return fmt.Sprintf("key %q is repeated (as %q: devices match keys in any letter case)", name, earlier)
}
