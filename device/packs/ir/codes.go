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

type codesFile struct {
	Codes map[string]string `json:"codes"`
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
	for name, h := range m {
		info := CodeInfo{Name: name}
		if code, err := ParseHex(h); err != nil {
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
	h, ok := m[name]
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
	code, err := ParseHex(h)
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
	_, replaced = m[name]
	m[name] = strings.ToUpper(hex.EncodeToString(code))
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
	if _, ok := m[name]; !ok {
		return fmt.Errorf("%w named %q", ErrUnknownCode, name)
	}
	delete(m, name)
	return c.save(m)
}

func (c *Codes) load() (map[string]string, error) {
	b, err := os.ReadFile(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read IR codes: %w", err)
	}
	var f codesFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("IR codes file %s is not valid JSON: %w", c.path, err)
	}
	if f.Codes == nil {
		f.Codes = map[string]string{}
	}
	return f.Codes, nil
}

func (c *Codes) save(m map[string]string) error {
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

// CheckName accepts 1 to 64 letters (any script), digits, spaces, '_', '-'
// and '.'.
func CheckName(name string) error {
	if name == "" || strings.TrimSpace(name) != name {
		return fmt.Errorf("code name %q must be non-empty without leading or trailing spaces", name)
	}
	if utf8.RuneCountInString(name) > maxNameLen {
		return fmt.Errorf("code name %q is longer than %d characters", name, maxNameLen)
	}
	for _, r := range name {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) && !strings.ContainsRune(" _-.", r) {
			return fmt.Errorf("code name %q: %q is not allowed (letters, digits, space, _ - . only)", name, r)
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
