package mcpclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/jsonscan"
	"github.com/mcpgate/mcpgate/internal/limits"
)

// ProtocolVersion is what initialize asks for by default. Devices answer
// 2024-11-05 whatever is asked and do not negotiate.
const ProtocolVersion = "2024-11-05"

// ServerInfo is the device's serverInfo from initialize.
type ServerInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// InitializeResult is the part of the initialize reply the gateway keeps.
type InitializeResult struct {
	ProtocolVersion string          `json:"protocolVersion"`
	Capabilities    json.RawMessage `json:"capabilities,omitempty"`
	ServerInfo      ServerInfo      `json:"serverInfo"`
}

// UnmarshalJSON reads an initialize result leniently, as hellos are read: a
// member of the wrong type ("serverInfo":"weird", "name":123) is left at its
// zero value, since the device did answer; only a result that is not a JSON
// object (nor null) is an error.
func (r *InitializeResult) UnmarshalJSON(data []byte) error {
	var m struct {
		ProtocolVersion json.RawMessage `json:"protocolVersion"`
		Capabilities    json.RawMessage `json:"capabilities"`
		ServerInfo      json.RawMessage `json:"serverInfo"`
	}
	if ok, err := object(data, &m); !ok || err != nil {
		return err
	}
	*r = InitializeResult{}
	lenient(m.ProtocolVersion, &r.ProtocolVersion)
	if len(m.Capabilities) > 0 && m.Capabilities[0] == '{' {
		r.Capabilities = m.Capabilities
	}
	lenient(m.ServerInfo, &r.ServerInfo)
	return nil
}

// UnmarshalJSON reads serverInfo leniently (see InitializeResult).
func (i *ServerInfo) UnmarshalJSON(data []byte) error {
	var m struct{ Name, Version json.RawMessage }
	if ok, err := object(data, &m); !ok || err != nil {
		return err
	}
	*i = ServerInfo{}
	lenient(m.Name, &i.Name)
	lenient(m.Version, &i.Version)
	return nil
}

// object decodes a JSON object into shadow, a struct of json.RawMessage
// members, for the lenient decoders: encoding/json matches the keys as it
// does for any struct. null is no object and no error (ok false), as
// encoding/json's own decoders take it.
func object(data []byte, shadow any) (ok bool, err error) {
	switch b := bytes.TrimSpace(data); {
	case string(b) == "null":
		return false, nil
	case len(b) == 0 || b[0] != '{':
		return false, fmt.Errorf("want a JSON object, got %s", truncate(b, 40))
	}
	return true, json.Unmarshal(data, shadow)
}

// lenient sets *dst to raw when raw decodes as a T, and leaves it alone
// when raw is absent or of another type.
func lenient[T any](raw json.RawMessage, dst *T) {
	if len(raw) == 0 {
		return
	}
	var v T
	if json.Unmarshal(raw, &v) == nil {
		*dst = v
	}
}

// Tool is one tool of a device's catalog. Raw holds the tool exactly as the
// device described it, so members this type does not model (title,
// outputSchema, _meta...) pass through.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"inputSchema,omitempty"`
	Annotations json.RawMessage `json:"annotations,omitempty"`
	Raw         json.RawMessage `json:"-"`
}

// MaxToolName bounds a tool's name, in bytes: MCP asks for names of 1-128
// characters, and this leaves room for names not in ASCII. It bounds what a
// caller can make the gateway store as a tool name (the audit log's tool).
const MaxToolName = 256

// ReservedToolPrefix starts the tool names of the gateway's own audit
// records (mcpgate:forget, mcpgate:key_create...). No catalog lists a tool
// of such a name and no call names one, so that no record of a call passes
// for an administrative action.
const ReservedToolPrefix = "mcpgate:"

// ErrBadToolName: a name no tool can have ([CheckToolName]).
var ErrBadToolName = errors.New("invalid tool name")

// CheckToolName returns an error matching ErrBadToolName when no tool can
// be named name: empty, over MaxToolName bytes, starting with
// ReservedToolPrefix, or holding control characters or bytes that are not
// UTF-8 (they would break the lines of every list and log that shows it).
// Both dialects skip such a tool. Its message quotes no more than
// MaxToolName bytes.
func CheckToolName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrBadToolName)
	case len(name) > MaxToolName:
		return fmt.Errorf("%w: %d bytes, over the limit of %d", ErrBadToolName, len(name), MaxToolName)
	case strings.HasPrefix(name, ReservedToolPrefix):
		return fmt.Errorf("%w: %q: names starting with %q are the gateway's own (its audit records)", ErrBadToolName, name, ReservedToolPrefix)
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Errorf("%w: %q contains control characters", ErrBadToolName, name)
	case !utf8.ValidString(name) || strings.ContainsRune(name, utf8.RuneError):
		// A caller's or device's byte that is not UTF-8 is read as U+FFFD.
		return fmt.Errorf("%w: %q holds a byte that is not UTF-8 (read as U+FFFD)", ErrBadToolName, name)
	}
	return nil
}

// UserOnly reports whether the tool is meant for the user only (hidden from
// models): annotations.audience is exactly ["user"].
func (t *Tool) UserOnly() bool {
	if len(t.Annotations) == 0 {
		return false
	}
	var a struct {
		Audience []string `json:"audience"`
	}
	if json.Unmarshal(t.Annotations, &a) != nil || len(a.Audience) == 0 {
		return false
	}
	for _, who := range a.Audience {
		if who != "user" {
			return false
		}
	}
	return true
}

// Discovery is what [Session.Discover] learned.
type Discovery struct {
	Init  InitializeResult
	Tools []Tool
	Pages int
	// Truncated says why the tool list may be incomplete (a guard stopped
	// paging, or a page failed after others succeeded); empty when complete.
	Truncated string
	// InitFailed says why initialize failed when the tools were listed
	// without it (devices serve tools/list and tools/call uninitialized);
	// empty when initialize succeeded. Init is then zero.
	InitFailed string
}

// ErrDiscovery wraps every discovery failure.
var ErrDiscovery = errors.New("discovery failed")

// Initialize sends initialize and, once its reply has arrived, the
// notifications/initialized notification. Devices must never see the two
// together with tools/list, so this returns only after both. A vision
// capability it carried is renewed from then on (see Config.Vision).
func (s *Session) Initialize(ctx context.Context) (*InitializeResult, error) {
	var v *Vision
	if s.cfg.Vision != nil {
		v = s.cfg.Vision()
	}
	sent := time.Now()
	res, err := s.initialize(ctx, v)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.init = res
	s.mu.Unlock()
	if v != nil {
		s.renewVisionAfter(renewalInterval(v, sent))
	}
	return res, nil
}

// initialize sends initialize with v as capabilities.vision (none when
// nil), then notifications/initialized, and returns the device's answer.
func (s *Session) initialize(ctx context.Context, v *Vision) (*InitializeResult, error) {
	type capabilities struct {
		Vision *Vision `json:"vision,omitempty"`
	}
	params := struct {
		ProtocolVersion string       `json:"protocolVersion"`
		Capabilities    capabilities `json:"capabilities"`
		ClientInfo      ServerInfo   `json:"clientInfo"`
	}{s.cfg.ProtocolVersion, capabilities{Vision: v}, ServerInfo{s.cfg.ClientName, s.cfg.ClientVersion}}

	reply, err := s.Request(ctx, "initialize", params, 0)
	if err != nil {
		return nil, err // it names initialize
	}
	if reply.Error != nil {
		return nil, &RPCError{Method: "initialize", Err: reply.Error}
	}
	var res InitializeResult
	if err := json.Unmarshal(reply.Result, &res); err != nil {
		return nil, fmt.Errorf("initialize: %w: %w", ErrMalformedResponse, err)
	}
	if err := s.Notify(ctx, "notifications/initialized", nil); err != nil {
		return nil, err
	}
	return &res, nil
}

// HasCapability reports whether the server declared capability name
// ("logging", "tools"...) in its initialize result.
func (r *InitializeResult) HasCapability(name string) bool {
	var caps map[string]json.RawMessage
	if json.Unmarshal(r.Capabilities, &caps) != nil {
		return false
	}
	v, ok := caps[name]
	return ok && string(v) != "null"
}

// SetLogLevel asks the server for its log messages from level up
// (logging/setLevel). Servers built on the official SDKs send none until
// asked.
func (s *Session) SetLogLevel(ctx context.Context, level string) error {
	reply, err := s.Request(ctx, "logging/setLevel", map[string]string{"level": level}, 0)
	if err != nil {
		return err // it names logging/setLevel
	}
	if reply.Error != nil {
		return &RPCError{Method: "logging/setLevel", Err: reply.Error}
	}
	return nil
}

// AdoptInitialize records res as the session's initialize result without
// sending initialize: another client of the device (an upstream voice
// server) initialized it, and the firmware applies initialize once per
// session. Discover then goes straight to tools/list, and the session's own
// vision capability is never sent: the device keeps the other client's.
func (s *Session) AdoptInitialize(res InitializeResult) {
	s.mu.Lock()
	s.init = &res
	s.mu.Unlock()
}

// Initialized reports whether the session has an initialize result, its
// own or adopted.
func (s *Session) Initialized() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.init != nil
}

// ListTools fetches every page of tools/list with withUserTools set, so
// user-only tools are known too. Paging stops at the last page (no
// nextCursor, or an empty one), and is guarded: a cursor seen before, a
// cursor naming a tool already listed, MaxPages and MaxTools all stop it,
// reported in the returned truncation reason with the tools gathered so far.
// A failing first page is an error; a failing later page truncates.
func (s *Session) ListTools(ctx context.Context) (tools []Tool, pages int, truncated string, err error) {
	seenCursor := map[string]bool{}
	seenTool := map[string]bool{}
	cursor := ""
	size := 0 // bytes of the tools kept
	for {
		if pages >= s.cfg.MaxPages {
			s.cfg.OnLimit(limits.MaxPages)
			return tools, pages, fmt.Sprintf("stopped after %d pages (limit)", pages), nil
		}
		params := map[string]any{"withUserTools": true}
		if cursor != "" {
			params["cursor"] = cursor
		}
		reply, err := s.Request(ctx, "tools/list", params, 0)
		if err == nil && reply.Error != nil {
			err = &RPCError{Method: "tools/list", Err: reply.Error}
		}
		var page toolsPage
		if err == nil {
			if page, err = decodeToolsPage(reply.Result); err != nil {
				err = fmt.Errorf("%w: tools/list: %w", ErrMalformedResponse, err)
			}
		}
		if err != nil {
			if pages == 0 || errors.Is(err, ErrDisconnected) {
				return nil, pages, "", err
			}
			return tools, pages, fmt.Sprintf("page %d failed: %v", pages+1, err), nil
		}
		pages++
		for _, raw := range page.Tools {
			t, err := decodeTool(raw)
			if err == nil {
				err = CheckToolName(t.Name)
			}
			if err != nil {
				s.log.Load().Warn("skipped malformed tool in tools/list", "page", pages, "error", err, "tool", truncate(raw, 200))
				continue
			}
			if seenTool[t.Name] {
				s.log.Load().Warn("skipped duplicate tool in tools/list", "tool", t.Name)
				continue
			}
			if len(tools) >= s.cfg.MaxTools {
				s.cfg.OnLimit(limits.MaxTools)
				return tools, pages, fmt.Sprintf("more than %d tools (limit)", s.cfg.MaxTools), nil
			}
			if size += len(raw); size > s.cfg.MaxCatalogBytes {
				s.cfg.OnLimit(limits.MaxCatalogBytes)
				return tools, pages, fmt.Sprintf("tools over %d bytes (limit)", s.cfg.MaxCatalogBytes), nil
			}
			t.Raw = raw
			seenTool[t.Name] = true
			tools = append(tools, t)
		}
		if page.NextCursor == nil || *page.NextCursor == "" {
			return tools, pages, "", nil
		}
		next := *page.NextCursor
		if seenCursor[next] || next == cursor {
			return tools, pages, fmt.Sprintf("device repeated cursor %q", next), nil
		}
		if seenTool[next] {
			return tools, pages, fmt.Sprintf("cursor %q names a tool already listed", next), nil
		}
		seenCursor[next] = true
		cursor = next
	}
}

// Discover runs the session start sequence: initialize, then
// notifications/initialized, then every tools/list page. When initialize
// fails but the session is still up (no answer in time, an error reply),
// it lists the tools all the same and says why in [Discovery.InitFailed]. The caller must have
// sent the transport's own handshake (the server hello) first. A transport
// that needs the server's identity before attaching the session (the MCP
// endpoint names sources by serverInfo) calls Initialize first: Discover then
// reuses its result, since an MCP session is initialized only once.
func (s *Session) Discover(ctx context.Context) (*Discovery, error) {
	s.mu.Lock()
	init := s.init
	s.mu.Unlock()
	var initErr error
	if init == nil {
		var err error
		if init, err = s.Initialize(ctx); err != nil {
			if errors.Is(err, ErrDisconnected) || s.Err() != nil || ctx.Err() != nil {
				return nil, fmt.Errorf("%w: %w", ErrDiscovery, err)
			}
			// A device that ignores or refuses initialize may still list
			// and run its tools (firmware does without initialize), and
			// nothing would ask it again on a session that lasts days.
			initErr, init = err, &InitializeResult{}
		}
	}
	tools, pages, truncated, err := s.ListTools(ctx)
	if err != nil {
		// err names tools/list.
		if initErr != nil {
			return nil, fmt.Errorf("%w: %w; without it, %w", ErrDiscovery, initErr, err)
		}
		return &Discovery{Init: *init}, fmt.Errorf("%w: %w", ErrDiscovery, err)
	}
	d := &Discovery{Init: *init, Tools: tools, Pages: pages, Truncated: truncated}
	if initErr != nil {
		d.InitFailed = initErr.Error()
	}
	return d, nil
}

// toolsPage is a tools/list result.
type toolsPage struct {
	Tools      []json.RawMessage `json:"tools"`
	NextCursor *string           `json:"nextCursor"`
}

// decodeToolsPage decodes a tools/list result. Handle has validated the
// reply whole, so a walk of the members replaces json.Unmarshal's two more
// scans of the page; anything unusual takes encoding/json's path, so odd
// pages decode exactly as they always did. The tools share result's memory.
func decodeToolsPage(result json.RawMessage) (toolsPage, error) {
	var p toolsPage
	var seen [2]bool
	ok := jsonscan.Members(result, func(key, v []byte) bool {
		switch string(key) {
		case "tools":
			if seen[0] || string(v) == "null" {
				return false
			}
			seen[0] = true
			p.Tools = []json.RawMessage{}
			return jsonscan.Elements(v, func(e []byte) bool {
				p.Tools = append(p.Tools, e)
				return true
			})
		case "nextCursor":
			if seen[1] || string(v) == "null" {
				return false
			}
			seen[1] = true
			s, ok := jsonscan.String(v)
			p.NextCursor = &s
			return ok
		}
		return !jsonscan.Folds(key, "tools", "nextCursor")
	})
	if ok {
		return p, nil
	}
	p = toolsPage{}
	err := json.Unmarshal(result, &p)
	return p, err
}

// decodeTool decodes one tool of a validated page, the way decodeToolsPage
// does its page.
func decodeTool(raw json.RawMessage) (Tool, error) {
	var t Tool
	var seen [4]bool
	names := []string{"name", "description", "inputSchema", "annotations"}
	ok := jsonscan.Members(raw, func(key, v []byte) bool {
		i := slices.Index(names, string(key))
		if i < 0 {
			return !jsonscan.Folds(key, names...)
		}
		if seen[i] {
			return false
		}
		seen[i] = true
		var ok bool
		switch i {
		case 0:
			t.Name, ok = jsonscan.String(v)
		case 1:
			t.Description, ok = jsonscan.String(v)
		case 2:
			t.InputSchema, ok = v, true
		case 3:
			t.Annotations, ok = v, true
		}
		return ok
	})
	if ok {
		return t, nil
	}
	t = Tool{}
	err := json.Unmarshal(raw, &t)
	return t, err
}
