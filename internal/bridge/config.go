package bridge

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
)

// Server is one local MCP server to bridge: a stdio child (Command) or a
// Streamable HTTP server (URL).
type Server struct {
	// Name is the source name asked of the gateway (?name=); empty lets the
	// gateway use the server's serverInfo.name.
	Name    string
	Command string
	Args    []string
	// Env is added to the bridge's own environment for the child.
	Env map[string]string
	// URL of a Streamable HTTP MCP server.
	URL string
	// Headers are sent with every HTTP request (e.g. Authorization).
	Headers map[string]string
}

func (s Server) validate() error {
	switch {
	case s.Command != "" && s.URL != "":
		return errors.New("set either command or url, not both")
	case s.Command == "" && s.URL == "":
		return errors.New("set command (stdio) or url (Streamable HTTP)")
	case s.URL != "":
		u, err := url.Parse(s.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
			return fmt.Errorf("url %q: want http(s)://host/path", s.URL)
		}
	}
	return nil
}

// ParseConfig reads the mcpServers format used by Claude Desktop, Cursor and
// mcp_pipe:
//
//	{"mcpServers": {
//	  "calc":  {"command": "python", "args": ["calc.py"], "env": {"K": "V"}},
//	  "notes": {"type": "http", "url": "http://127.0.0.1:3000/mcp"}}}
//
// Each key becomes the server's Name. Entries with "disabled": true are
// skipped. Types other than stdio and http (such as sse) are refused.
func ParseConfig(data []byte) ([]Server, error) {
	var file struct {
		MCPServers map[string]struct {
			Type     string            `json:"type"`
			Command  string            `json:"command"`
			Args     []string          `json:"args"`
			Env      map[string]string `json:"env"`
			URL      string            `json:"url"`
			Headers  map[string]string `json:"headers"`
			Disabled bool              `json:"disabled"`
		} `json:"mcpServers"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	if len(file.MCPServers) == 0 {
		return nil, errors.New(`config has no servers: want {"mcpServers": {"name": {"command": ...}}}`)
	}
	var out []Server
	for name, e := range file.MCPServers {
		if e.Disabled {
			continue
		}
		switch strings.ToLower(e.Type) {
		case "", "stdio", "http", "streamable-http", "streamablehttp":
		default:
			return nil, fmt.Errorf("server %q: type %q is not supported (use stdio or http)", name, e.Type)
		}
		s := Server{Name: name, Command: e.Command, Args: e.Args, Env: e.Env, URL: e.URL, Headers: e.Headers}
		if err := s.validate(); err != nil {
			return nil, fmt.Errorf("server %q: %w", name, err)
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, errors.New("every server in the config is disabled")
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
