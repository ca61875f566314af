package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Authenticate is the REST door's authentication, wrapped around every
// /api/v1 route (whoever registers it), /metrics and the gateway's other
// REST routes. In order:
//
//  1. /healthz and /readyz stay open (health checks carry no key).
//  2. The caller is authenticated by doors: a key, or the local caller
//     when keys are not required (401 unauthorized otherwise).
//  3. The route's scope ([RequiredScope]) is checked: 403 forbidden.
//  4. A route under /api/v1/devices/{ref} naming a device outside the key's
//     device patterns answers 404 device_not_found, exactly as an unknown
//     device does, so a key cannot learn what exists beyond its reach. The
//     patterns hold for ids the hub does not know too ([canReach]): a
//     revocation takes any id.
//
// Handlers then find the principal with auth.FromContext and filter what
// they list by it.
func Authenticate(doors *auth.Doors, h *hub.Hub) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" {
				next.ServeHTTP(w, r)
				return
			}
			p, err := doors.Authenticate(r)
			if err != nil {
				doors.Refuse(w, r, err)
				return
			}
			// The scope first: it does not depend on the device, so a key
			// short of it learns nothing of which devices exist.
			if need := RequiredScope(r.Method, r.URL.Path); !p.Can(need) {
				auth.Forbid(w, p, need)
				return
			}
			// A tool call checks for itself (callTool): refused as a call to
			// an unknown device is, its rate charged and audited.
			if ref, ok := deviceRef(r.URL); ok && !(r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/tools/call")) {
				if !canReach(r.Context(), h, p, ref) {
					writeError(w, http.StatusNotFound, "device_not_found", fmt.Errorf("%w: %q", hub.ErrDeviceNotFound, ref).Error(), nil)
					return
				}
			}
			r = r.WithContext(auth.WithPrincipal(r.Context(), p))
			if r.URL.Path == "/api/v1/events" { // a stream: it ends when its key stops working
				var stop func()
				r, stop = doors.Hold(r, p)
				defer stop()
			}
			next.ServeHTTP(w, r)
		})
	}
}

// canReach reports whether the device ref names is within p's device
// patterns: a device the hub knows by its id and alias, any other ref as
// the id it would be (normalised). A device not connected yet, or
// forgotten, may hold a token that a revocation reaches, so a key limited
// to some devices must not name ids beyond them, known or not.
func canReach(ctx context.Context, h *hub.Hub, p *auth.Principal, ref string) bool {
	if id, alias, ok := h.IdentifyContext(ctx, ref); ok {
		return p.CanSeeDevice(id, alias)
	}
	id, err := xiaozhi.NormalizeDeviceID(ref)
	if err != nil {
		id = ref // no id: what the route answers (404) is the same either way
	}
	return p.CanSeeDevice(id, "")
}

// RequiredScope is the scope a REST request needs: read to look (GET, HEAD,
// the event stream, /metrics), call to call a tool (live or queued), cancel
// a queued call or talk to a device's agent, admin for everything else (alias changes, revocations, forgetting a
// device, and any route added later until it says otherwise: safe by default)
// and for every key route, listing included.
func RequiredScope(method, path string) auth.Scope {
	if path == "/api/v1/keys" || strings.HasPrefix(path, "/api/v1/keys/") || strings.HasPrefix(path, "/api/v1/oauth/") {
		return auth.ScopeAdmin // even listing them; OAuth consent creates keys
	}
	switch method {
	case http.MethodGet, http.MethodHead:
		return auth.ScopeRead
	case http.MethodPost:
		if strings.HasPrefix(path, "/api/v1/devices/") && (strings.HasSuffix(path, "/tools/call") || strings.HasSuffix(path, "/chat")) {
			return auth.ScopeCall
		}
	case http.MethodDelete:
		if strings.HasPrefix(path, "/api/v1/calls/") {
			return auth.ScopeCall
		}
	}
	return auth.ScopeAdmin
}

// deviceRef returns the {ref} of a /api/v1/devices/{ref}[/...] URL,
// unescaped as the mux will see it.
func deviceRef(u *url.URL) (string, bool) {
	rest, ok := strings.CutPrefix(u.EscapedPath(), "/api/v1/devices/")
	if !ok {
		return "", false
	}
	seg, _, _ := strings.Cut(rest, "/")
	ref, err := url.PathUnescape(seg)
	if err != nil || ref == "" {
		return "", false
	}
	return ref, true
}

// principal is the request's caller. Requests reach handlers only through
// Authenticate; without it (a handler mounted bare) nothing is visible.
func principal(r *http.Request) *auth.Principal { return auth.FromContext(r.Context()) }

// visibleTools counts the tools of a device the principal may see.
func visibleTools(p *auth.Principal, h *hub.Hub, d hub.Device) int {
	if len(p.Tools) == 0 {
		return d.Tools
	}
	_, cat, err := h.Tools(d.ID)
	if err != nil || cat == nil {
		return 0
	}
	n := 0
	for i := range cat.Tools {
		if p.CanSeeTool(cat.Tools[i].Name) {
			n++
		}
	}
	return n
}

// visibleEvent returns the event as the principal may see it, or false: events
// of invisible devices are dropped, call events of invisible tools too, and a
// tools_changed diff keeps only visible names. An event never names a
// device by an alias the principal may not see (visibleDevice).
func visibleEvent(p *auth.Principal, h *hub.Hub, ev hub.Event) (hub.Event, bool) {
	if len(p.Devices) > 0 {
		var ok bool
		if ev, ok = visibleDevice(p, h, ev); !ok {
			return ev, false
		}
	}
	if len(p.Tools) == 0 {
		return ev, true
	}
	switch data := ev.Data.(type) {
	case hub.CallData:
		return ev, p.CanSeeTool(data.Tool)
	case *hub.CallData:
		return ev, data != nil && p.CanSeeTool(data.Tool)
	case hub.QueuedCallData:
		return ev, p.CanSeeTool(data.Tool)
	case hub.ToolsChangedData:
		ev.Data = filterToolsChanged(p, h, ev.Device, data)
	case *hub.ToolsChangedData:
		if data != nil {
			ev.Data = filterToolsChanged(p, h, ev.Device, *data)
		}
	}
	return ev, true
}

// visibleDevice returns the event as a principal limited to some devices
// may see it, or false when its device is beyond them.
//
// An alias_changed is judged by the names it carries, not by the alias the
// device has by the time it is sent: renamed to an alias the principal may
// not see, the device leaves its view and nothing is sent, as for any event
// of a device it may not see; renamed from one, the event comes without its
// data (the old alias). Any other event is sent when the principal may see
// the device by its alias then or now, and under a name it may see.
func visibleDevice(p *auth.Principal, h *hub.Hub, ev hub.Event) (hub.Event, bool) {
	if ev.Type == hub.EventAlias {
		if !p.CanSeeDevice(ev.Device, ev.Alias) {
			return ev, false
		}
		if data, ok := ev.Data.(map[string]string); !ok || !p.CanSeeDevice(ev.Device, data["old"]) {
			ev.Data = nil
		}
		return ev, true
	}
	now := ev.Alias
	if d, err := h.Device(ev.Device); err == nil {
		now = d.Alias
	}
	switch {
	case ev.Alias != "" && p.CanSeeDevice(ev.Device, ev.Alias):
	case p.CanSeeDevice(ev.Device, now):
		if ev.Alias != "" {
			ev.Alias = now // it had a name the principal may not see then
		}
	default:
		return ev, false
	}
	return ev, true
}

func filterToolsChanged(p *auth.Principal, h *hub.Hub, device string, d hub.ToolsChangedData) hub.ToolsChangedData {
	keep := func(names []string) []string {
		var out []string
		for _, n := range names {
			if p.CanSeeTool(n) {
				out = append(out, n)
			}
		}
		return out
	}
	d.Added, d.Removed, d.Changed = keep(d.Added), keep(d.Removed), keep(d.Changed)
	if dev, err := h.Device(device); err == nil {
		d.Count = visibleTools(p, h, dev)
	}
	return d
}
