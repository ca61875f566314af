package device

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
)

// DefaultPageBudget is the most bytes one tools/list result may take, as in
// firmware.
const DefaultPageBudget = 8000

// ServerOptions configures a [Server]. The zero value is usable.
type ServerOptions struct {
	// Profile is the behaviour to reproduce; "" means ProfileESP32.
	Profile Profile
	// Name and Version are sent as serverInfo in the initialize reply
	// (firmware: board name and firmware version). "" means
	// "mcpgate-device" and "1.0.0".
	Name, Version string
	// PageBudget bounds the size in bytes of one tools/list result; 0 means
	// DefaultPageBudget.
	PageBudget int
	// Logger receives debug logs about dropped messages; nil discards them.
	Logger *slog.Logger
}

// Vision is where the device uploads camera photos, as announced by the
// gateway in initialize's capabilities.vision.
type Vision struct {
	URL   string
	Token string
}

// Server is the MCP server side of a device: it owns the tools and answers
// JSON-RPC messages the way the chosen [Profile] does.
//
// A Server is safe for concurrent use. Tools may be added and removed while
// messages are being handled. Server state (tools, vision) outlives
// connections: reuse one Server across reconnects, as a device does.
type Server struct {
	profile Profile
	name    string
	version string
	budget  int
	log     *slog.Logger

	mu     sync.RWMutex // guards the fields below
	tools  []*entry     // registration order, which is tools/list order
	vision Vision
	conns  map[*Conn]struct{} // connections told when the tools change
}

// entry is a registered tool and its tools/list item, encoded once.
type entry struct {
	tool     Tool
	item     []byte // the tool's JSON in this profile's form
	nameJSON []byte // the name as a JSON string, for nextCursor sizes
}

// NewServer returns a server with no tools.
func NewServer(opts ServerOptions) (*Server, error) {
	s := &Server{
		profile: opts.Profile,
		name:    opts.Name,
		version: opts.Version,
		budget:  opts.PageBudget,
		log:     opts.Logger,
	}
	if s.profile == "" {
		s.profile = ProfileESP32
	}
	if !s.profile.valid() {
		return nil, fmt.Errorf("device: invalid profile %q", opts.Profile)
	}
	if s.name == "" {
		s.name = "mcpgate-device"
	}
	if s.version == "" {
		s.version = "1.0.0"
	}
	switch {
	case s.budget == 0:
		s.budget = DefaultPageBudget
	case s.budget < 0:
		return nil, fmt.Errorf("device: negative page budget %d", s.budget)
	}
	if s.log == nil {
		s.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return s, nil
}

// Profile returns the server's profile.
func (s *Server) Profile() Profile { return s.profile }

// AddTool registers a tool at the end of the catalog. It rejects a tool that
// is invalid or whose name is already taken.
func (s *Server) AddTool(t Tool) error {
	t, err := t.validate()
	if err != nil {
		return err
	}
	e := &entry{tool: t, item: s.encodeTool(t), nameJSON: jsonString(t.Name)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.find(t.Name) >= 0 {
		return fmt.Errorf("device: tool %q already added", t.Name)
	}
	s.tools = append(s.tools, e)
	s.toolsChanged()
	return nil
}

// RemoveTool removes a tool and reports whether it was there.
func (s *Server) RemoveTool(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.find(name)
	if i < 0 {
		return false
	}
	s.tools = slices.Delete(s.tools, i, i+1)
	s.toolsChanged()
	return true
}

// toolsChanged tells every connection that the catalog changed. s.mu must
// be held; Conn.toolsChanged only starts a timer.
func (s *Server) toolsChanged() {
	for c := range s.conns {
		c.toolsChanged()
	}
}

// Tools returns the registered tools in catalog order.
func (s *Server) Tools() []Tool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Tool, len(s.tools))
	for i, e := range s.tools {
		out[i] = e.tool
		out[i].Properties = slices.Clone(e.tool.Properties)
	}
	return out
}

// Vision returns the photo upload target from the last initialize that
// carried one; the zero Vision before that.
func (s *Server) Vision() Vision {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.vision
}

// find returns the index of the named tool, or -1. s.mu must be held.
func (s *Server) find(name string) int {
	return slices.IndexFunc(s.tools, func(e *entry) bool { return e.tool.Name == name })
}

func (s *Server) lookup(name string) (Tool, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if i := s.find(name); i >= 0 {
		return s.tools[i].tool, true
	}
	return Tool{}, false
}

// encodeTool returns the tool's tools/list item with keys in firmware order.
func (s *Server) encodeTool(t Tool) []byte {
	var b bytes.Buffer
	b.WriteString(`{"name":`)
	appendJSONString(&b, t.Name)
	b.WriteString(`,"description":`)
	appendJSONString(&b, t.Description)
	b.WriteString(`,"inputSchema":`)
	appendSchema(&b, t.Properties, s.profile == ProfilePyXiaozhi)
	if t.UserOnly {
		b.WriteString(`,"annotations":{"audience":["user"]}`)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// Handle processes one JSON-RPC message (the payload of an "mcp" envelope)
// and returns the reply payload, or nil when the profile sends none. A
// tools/call runs its handler before Handle returns, with ctx.
//
// Handle never fails: malformed input yields the profile's error reply or
// nothing. For ProfileESP32 an error reply may deliberately not be valid
// JSON (firmware does not escape error messages). Handle ignores
// notifications/cancelled: a transport whose peer may cancel calls uses a
// [Conn].
func (s *Server) Handle(ctx context.Context, payload []byte) []byte {
	reply, c := s.dispatch(payload)
	if c != nil && c.cancels == nil {
		return c.run(ctx)
	}
	return reply
}
