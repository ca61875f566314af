package ir

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// maxNameLen bounds a code's name, in characters.
const maxNameLen = 64

// ErrUnknownCode is returned for a name that has no saved code.
var ErrUnknownCode = errors.New("no saved IR code")

// Codes is the file of named IR codes: a JSON object
// {"codes": {"tv_power": "A1B2C3..."}} a person can read and edit. Every
// change rewrites the file atomically (a temporary file, synced, renamed
// over the old one), so a power cut never leaves half a file.
//
// Codes is safe for concurrent use. It reads the file on every call, so
// edits made by hand are seen without a restart.
type Codes struct {
	path string
	mu   sync.Mutex // serialises read-modify-write
}

// codesFile is the file's shape. Entries stay raw so that one hand-edited
// entry of the wrong type (a number, a list) is listed as invalid, like one
// that is not hex, instead of making every code unreadable; a save keeps it
// as it was.
type codesFile struct {
	Codes map[string]json.RawMessage `json:"codes"`
}

// NewCodes returns the code store at path; the file need not exist.
func NewCodes(path string) *Codes { return &Codes{path: path} }

// Path returns the file's path.
func (c *Codes) Path() string { return c.path }

// CodeInfo describes a saved code.
type CodeInfo struct {
	Name  string `json:"name"`
	Bytes int    `json:"bytes"`
	// Invalid says why the saved text is not a code (a hand-edited file),
	// which send_named refuses too; "" for a valid one.
	Invalid string `json:"invalid,omitempty"`
}

// List returns the saved codes sorted by name.
func (c *Codes) List() ([]CodeInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, err := c.load()
	if err != nil {
		return nil, err
	}
	out := make([]CodeInfo, 0, len(m))
	for name, raw := range m {
		info := CodeInfo{Name: name}
		if code, err := parseEntry(raw); err != nil {
			info.Invalid = err.Error()
		} else {
			info.Bytes = len(code)
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b CodeInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Get returns the named code.
func (c *Codes) Get(name string) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, err := c.load()
	if err != nil {
		return nil, err
	}
	key, ok := lookup(m, name)
	if !ok {
		names := make([]string, 0, len(m))
		for n := range m {
			names = append(names, n)
		}
		slices.Sort(names)
		if len(names) == 0 {
			return nil, fmt.Errorf("%w named %q: none are saved yet (learn one with self.ir.learn_external)", ErrUnknownCode, name)
		}
		return nil, fmt.Errorf("%w named %q; saved: %s", ErrUnknownCode, name, strings.Join(names, ", "))
	}
	code, err := parseEntry(m[key])
	if err != nil {
		return nil, fmt.Errorf("code %q in %s: %w", name, c.path, err)
	}
	return code, nil
}

// Put saves a code under name and reports whether it replaced one.
func (c *Codes) Put(name string, code []byte) (replaced bool, err error) {
	if err := CheckName(name); err != nil {
		return false, err
	}
	if len(code) == 0 {
		return false, errors.New("empty code")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m, err := c.load()
	if err != nil {
		return false, err
	}
	// Saved under the composed (NFC) form, so "é" typed as e + U+0301 and
	// as U+00E9 is one name.
	if old, ok := lookup(m, name); ok {
		delete(m, old)
		replaced = true
	}
	h, err := json.Marshal(strings.ToUpper(hex.EncodeToString(code)))
	if err != nil {
		return false, err
	}
	m[norm.NFC.String(name)] = h
	return replaced, c.save(m)
}

// Delete removes the named code.
func (c *Codes) Delete(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, err := c.load()
	if err != nil {
		return err
	}
	key, ok := lookup(m, name)
	if !ok {
		return fmt.Errorf("%w named %q", ErrUnknownCode, name)
	}
	delete(m, key)
	return c.save(m)
}

// lookup returns the key under which name is saved: name itself, or else a
// key with the same NFC form (a file edited by hand may hold either form).
func lookup(m map[string]json.RawMessage, name string) (string, bool) {
	if _, ok := m[name]; ok {
		return name, true
	}
	want := norm.NFC.String(name)
	for k := range m {
		if norm.NFC.String(k) == want {
			return k, true
		}
	}
	return "", false
}

// parseEntry decodes one saved entry: a string of hex digits.
func parseEntry(raw json.RawMessage) ([]byte, error) {
	var h string
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, fmt.Errorf("%s is not a string of hex digits", jsonKind(raw))
	}
	return ParseHex(h)
}

// jsonKind names the type of a JSON value for an error message.
func jsonKind(raw json.RawMessage) string {
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "a list"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "the number " + string(raw)
	}
}

func (c *Codes) load() (map[string]json.RawMessage, error) {
	b, err := os.ReadFile(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]json.RawMessage{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read IR codes: %w", err)
	}
	var f codesFile
	if err := json.Unmarshal(b, &f); err != nil {
		if _, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
			return nil, fmt.Errorf(`IR codes file %s must be {"codes": {"name": "hex", ...}}: %w`, c.path, err)
		}
		return nil, fmt.Errorf("IR codes file %s is not valid JSON: %w", c.path, err)
	}
	if f.Codes == nil {
		f.Codes = map[string]json.RawMessage{}
	}
	return f.Codes, nil
}

func (c *Codes) save(m map[string]json.RawMessage) error {
	b, err := json.MarshalIndent(codesFile{Codes: m}, "", "  ")
	if err != nil {
		return err
	}
	if err := WriteFileAtomic(c.path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("save IR codes: %w", err)
	}
	return nil
}

// WriteFileAtomic replaces path with data: it writes a temporary file in the
// same directory, syncs it, renames it over path and syncs the directory.
func WriteFileAtomic(path string, data []byte, perm fs.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename, a no-op
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // best effort: makes the rename durable
		d.Close()
	}
	return nil
}

// CheckName accepts 1 to 64 letters (any script, with the combining marks
// that follow a letter: the vowel signs of Thai and Hindi, a decomposed
// accent), digits, spaces, '_', '-' and '.'. The length is counted on the
// composed (NFC) form, the form Put saves.
func CheckName(name string) error {
	if name == "" || strings.TrimSpace(name) != name {
		return fmt.Errorf("code name %q must be non-empty without leading or trailing spaces", name)
	}
	if utf8.RuneCountInString(norm.NFC.String(name)) > maxNameLen {
		return fmt.Errorf("code name %q is longer than %d characters", name, maxNameLen)
	}
	afterLetter := false // the previous rune is a letter or a mark on one
	for _, r := range name {
		switch {
		case unicode.IsLetter(r):
			afterLetter = true
		case unicode.In(r, unicode.Mn, unicode.Mc):
			if !afterLetter {
				return fmt.Errorf("code name %q: %q is a combining mark with no letter before it", name, r)
			}
		case unicode.IsDigit(r) || strings.ContainsRune(" _-.", r):
			afterLetter = false
		default:
			return fmt.Errorf("code name %q: %q is not allowed (letters with their marks, digits, space, _ - . only)", name, r)
		}
	}
	return nil
}

// ParseHex parses a code written as hex digits, tolerating spaces, commas,
// colons and 0x prefixes: "A1 B2 C3", "0xA1,0xB2", "a1b2c3".
func ParseHex(s string) ([]byte, error) {
	var b strings.Builder
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' || r == ':' || r == '\t' || r == '\n' }) {
		f = strings.TrimPrefix(strings.TrimPrefix(f, "0x"), "0X")
		b.WriteString(f)
	}
	h := b.String()
	if h == "" {
		return nil, errors.New("no hex digits")
	}
	if len(h)%2 != 0 {
		return nil, fmt.Errorf("odd number of hex digits (%d)", len(h))
	}
	code, err := hex.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("not hex: %w", err)
	}
	return code, nil
}
