package device

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// PropertyType is the JSON type of a tool argument. Firmware knows only
// these three.
type PropertyType int

// The property types.
const (
	Boolean PropertyType = iota + 1
	Integer
	String
)

func (t PropertyType) String() string {
	switch t {
	case Boolean:
		return "boolean"
	case Integer:
		return "integer"
	case String:
		return "string"
	}
	return "PropertyType(" + strconv.Itoa(int(t)) + ")"
}

// Property is one argument of a tool.
//
// A property is required exactly when it has no Default, as in firmware.
// Min and Max apply to Integer properties only; either may be nil.
type Property struct {
	Name        string
	Type        PropertyType
	Description string // optional; firmware never sends one
	Default     any    // nil = required; otherwise a bool, string or Go integer matching Type
	Min, Max    *int   // Integer only
}

// Int returns a required integer property limited to [min, max].
func Int(name string, min, max int) Property {
	return Property{Name: name, Type: Integer, Min: &min, Max: &max}
}

// IntDefault returns an optional integer property limited to [min, max].
func IntDefault(name string, def, min, max int) Property {
	return Property{Name: name, Type: Integer, Default: def, Min: &min, Max: &max}
}

// Str returns a required string property.
func Str(name string) Property { return Property{Name: name, Type: String} }

// StrDefault returns an optional string property.
func StrDefault(name, def string) Property { return Property{Name: name, Type: String, Default: def} }

// Bool returns a required boolean property.
func Bool(name string) Property { return Property{Name: name, Type: Boolean} }

// BoolDefault returns an optional boolean property.
func BoolDefault(name string, def bool) Property {
	return Property{Name: name, Type: Boolean, Default: def}
}

// Required reports whether the property has no default.
func (p Property) Required() bool { return p.Default == nil }

// normalize validates the property and returns it with Default converted to
// the one Go type the server works with for its Type (bool, int, string).
func (p Property) normalize() (Property, error) {
	if p.Name == "" {
		return p, errors.New("property without a name")
	}
	switch p.Type {
	case Boolean, String:
		if p.Min != nil || p.Max != nil {
			return p, fmt.Errorf("property %q: minimum and maximum apply to integers only", p.Name)
		}
	case Integer:
		if p.Min != nil && p.Max != nil && *p.Min > *p.Max {
			return p, fmt.Errorf("property %q: minimum %d above maximum %d", p.Name, *p.Min, *p.Max)
		}
	default:
		return p, fmt.Errorf("property %q: invalid type %d", p.Name, int(p.Type))
	}
	if p.Default == nil {
		return p, nil
	}
	def, ok := convertDefault(p.Type, p.Default)
	if !ok {
		return p, fmt.Errorf("property %q: default %v (%T) is not a %s", p.Name, p.Default, p.Default, p.Type)
	}
	if p.Type == Integer {
		n := def.(int)
		if (p.Min != nil && n < *p.Min) || (p.Max != nil && n > *p.Max) {
			return p, fmt.Errorf("property %q: default %d outside its range", p.Name, n)
		}
	}
	p.Default = def
	// Copy the bounds so a caller reusing its ints cannot change a registered tool.
	if p.Min != nil {
		m := *p.Min
		p.Min = &m
	}
	if p.Max != nil {
		m := *p.Max
		p.Max = &m
	}
	return p, nil
}

func convertDefault(t PropertyType, v any) (any, bool) {
	switch t {
	case Boolean:
		b, ok := v.(bool)
		return b, ok
	case String:
		s, ok := v.(string)
		return s, ok
	}
	var n int64
	switch x := v.(type) {
	case int:
		n = int64(x)
	case int8:
		n = int64(x)
	case int16:
		n = int64(x)
	case int32:
		n = int64(x)
	case int64:
		n = x
	case uint8:
		n = int64(x)
	case uint16:
		n = int64(x)
	case uint32:
		n = int64(x)
	default:
		return nil, false
	}
	// Firmware stores integers as C int; keep defaults in that range.
	if n < math.MinInt32 || n > math.MaxInt32 {
		return nil, false
	}
	return int(n), true
}

// appendSchema appends the tool's inputSchema exactly as firmware prints it:
// keys in firmware order, properties in declaration order, "required" left
// out when empty unless alwaysRequired (py-xiaozhi always sends it).
func appendSchema(b *bytes.Buffer, props []Property, alwaysRequired bool) {
	b.WriteString(`{"type":"object","properties":{`)
	var required []string
	for i, p := range props {
		if i > 0 {
			b.WriteByte(',')
		}
		appendJSONString(b, p.Name)
		b.WriteString(`:{"type":"`)
		b.WriteString(p.Type.String())
		b.WriteByte('"')
		if p.Description != "" {
			b.WriteString(`,"description":`)
			appendJSONString(b, p.Description)
		}
		if p.Default != nil {
			b.WriteString(`,"default":`)
			switch d := p.Default.(type) {
			case bool:
				b.WriteString(strconv.FormatBool(d))
			case int:
				b.WriteString(strconv.Itoa(d))
			case string:
				appendJSONString(b, d)
			}
		} else {
			required = append(required, p.Name)
		}
		if p.Min != nil {
			b.WriteString(`,"minimum":`)
			b.WriteString(strconv.Itoa(*p.Min))
		}
		if p.Max != nil {
			b.WriteString(`,"maximum":`)
			b.WriteString(strconv.Itoa(*p.Max))
		}
		b.WriteByte('}')
	}
	b.WriteByte('}')
	if len(required) > 0 || alwaysRequired {
		b.WriteString(`,"required":[`)
		for i, name := range required {
			if i > 0 {
				b.WriteByte(',')
			}
			appendJSONString(b, name)
		}
		b.WriteByte(']')
	}
	b.WriteByte('}')
}

// appendJSONString appends s as a JSON string without HTML escaping, the way
// cJSON prints it (so "<" stays "<", which keeps page sizes comparable).
func appendJSONString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a Go string always encodes
	b.Truncate(b.Len() - 1)
}

// jsonString returns s as a JSON string.
func jsonString(s string) []byte {
	var b bytes.Buffer
	appendJSONString(&b, s)
	return b.Bytes()
}

// marshal is json.Marshal without HTML escaping.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'}), nil
}
