package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/mcpgate/mcpgate/internal/audit"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/jsonscan"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// AuditSource reads the audit log; a [store.Store] is one.
type AuditSource interface {
	Audit(ctx context.Context, q store.AuditQuery) ([]store.AuditRecord, error)
}

// AuditRecord is one tool call as GET /api/v1/audit lists it.
type AuditRecord struct {
	Seq    int64     `json:"seq"`
	Time   time.Time `json:"time"`
	Caller string    `json:"caller"`
	Door   string    `json:"door"`
	Device string    `json:"device"`
	// Alias is the device's alias now (not at the time of the call); empty
	// when the gateway no longer knows the device.
	Alias     string          `json:"alias,omitempty"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	Outcome   string          `json:"outcome"`
	LatencyMS float64         `json:"latency_ms"`
	ErrorCode string          `json:"error_code,omitempty"`
	Error     string          `json:"error,omitempty"`
	// CallID and QueuedAt name a queued call and say when it was queued
	// (docs/queued-calls.md); Time is then when it was delivered.
	CallID   string     `json:"call_id,omitempty"`
	QueuedAt *time.Time `json:"queued_at,omitempty"`
	// Node is the gateway node that took the call, ServedBy the node that
	// ran or refused it (docs/cluster.md): another node for a call routed
	// to the node holding the device. Empty in records older than both.
	Node     string `json:"node,omitempty"`
	ServedBy string `json:"served_by,omitempty"`
}

// AuditPage is the body of GET /api/v1/audit: records newest first, and
// Next, when older records match (or a restricted key's scan stopped
// early, auditMaxScan), the value of before for the next page.
type AuditPage struct {
	Records []AuditRecord `json:"records"`
	Next    string        `json:"next,omitempty"`
}

// Audit query bounds.
const (
	auditDefaultLimit = 100
	auditMaxLimit     = 1000
	// auditMaxScan bounds the records one request examines for a key
	// restricted to some devices or tools; the page then ends early, with
	// a next cursor where the scan stopped.
	auditMaxScan = 20 * auditMaxLimit
)

// audit answers GET /api/v1/audit?device=&tool=&caller=&since=&before=&limit=.
func (a *API) audit(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Audit == nil {
		writeError(w, http.StatusServiceUnavailable, "audit_unavailable", "this gateway keeps no audit log (it runs without a store)", nil)
		return
	}
	q, err := a.auditQuery(r.URL.Query(), time.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error(), nil)
		return
	}
	page, err := a.auditPage(r.Context(), principal(r), q)
	if err != nil {
		if r.Context().Err() != nil {
			return // the caller left
		}
		a.storeLog.Failed(a.log, slog.LevelError, "could not read the audit log", err)
		writeError(w, http.StatusServiceUnavailable, "store_error", "could not read the audit log: "+err.Error(), nil)
		return
	}
	a.storeLog.OK(a.log, "could not read the audit log", "the audit log can be read again")
	writeJSON(w, http.StatusOK, page)
}

// auditQuery parses the query string. A device is an id in any form or an
// alias; one the gateway no longer knows is matched by its normalised id, or
// exactly as given.
func (a *API) auditQuery(v url.Values, now time.Time) (store.AuditQuery, error) {
	q := store.AuditQuery{Tool: v.Get("tool"), Caller: v.Get("caller"), Outcome: v.Get("outcome"), Limit: auditDefaultLimit}
	if ref := v.Get("device"); ref != "" {
		if d, err := a.hub.Device(ref); err == nil {
			q.Device = d.ID
		} else if id, err := xiaozhi.NormalizeDeviceID(ref); err == nil {
			q.Device = id
		} else {
			q.Device = ref
		}
	}
	if s := v.Get("since"); s != "" {
		t, err := audit.ParseSince(s, now)
		if err != nil {
			return q, err
		}
		q.Since = t
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > auditMaxLimit {
			return q, fmt.Errorf("limit %q: want a number from 1 to %d", s, auditMaxLimit)
		}
		q.Limit = n
	}
	if s := v.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			return q, fmt.Errorf("before %q: want the next value of a previous page", s)
		}
		q.Before = n
	}
	return q, nil
}

// auditPage reads one page of records the principal may see: all of them
// for a key without device or tool patterns (and for the local caller),
// those of its devices and tools otherwise, none without a principal.
func (a *API) auditPage(ctx context.Context, p *auth.Principal, q store.AuditQuery) (AuditPage, error) {
	page := AuditPage{Records: []AuditRecord{}}
	if p == nil {
		return page, nil
	}
	// One record past the page says whether there are more.
	limit := q.Limit
	restricted := len(p.Devices) > 0 || len(p.Tools) > 0
	q.Limit = min(limit+1, auditMaxLimit)
	if restricted {
		q.Limit = auditMaxLimit // read ahead: some records will be filtered out
	}
	aliases := make(map[string]string)
	alias := func(id string) string {
		al, ok := aliases[id]
		if !ok {
			if d, err := a.hub.Device(id); err == nil && d.ID == id {
				al = d.Alias
			}
			aliases[id] = al
		}
		return al
	}
	for scanned := 0; ; {
		recs, err := a.cfg.Audit.Audit(ctx, q)
		if err != nil {
			return page, err
		}
		for _, r := range recs {
			scanned++
			al := alias(r.Device)
			if restricted && (!p.CanSeeDevice(r.Device, al) || !p.CanSeeTool(r.Tool)) {
				continue
			}
			if len(page.Records) == limit {
				page.Next = strconv.FormatInt(page.Records[limit-1].Seq, 10)
				return page, nil
			}
			page.Records = append(page.Records, auditJSON(r, al))
		}
		if len(recs) < q.Limit {
			return page, nil // the log has no more
		}
		q.Before = recs[len(recs)-1].Seq
		if !restricted {
			q.Limit = limit + 1 - len(page.Records) // only the record past the page is left to read
		}
		if scanned >= auditMaxScan {
			page.Next = strconv.FormatInt(q.Before, 10)
			return page, nil
		}
	}
}

func auditJSON(r store.AuditRecord, alias string) AuditRecord {
	// json.Valid passes bytes that are not UTF-8 inside strings (a row
	// stored before calls' arguments were made UTF-8): the answer reads
	// them as U+FFFD, as it does in its string fields.
	args := jsonscan.FixUTF8(r.Arguments)
	if !json.Valid(args) {
		args = json.RawMessage("null")
	}
	rec := AuditRecord{Seq: r.Seq, Time: r.Time.UTC(), Caller: r.Caller, Door: r.Door, Device: r.Device, Alias: alias,
		Tool: r.Tool, Arguments: args, Outcome: r.Outcome, LatencyMS: r.LatencyMS, ErrorCode: r.ErrorCode, Error: r.Error,
		CallID: r.CallID, Node: r.Node, ServedBy: r.ServedBy}
	if !r.QueuedAt.IsZero() {
		t := r.QueuedAt.UTC()
		rec.QueuedAt = &t
	}
	return rec
}

// AuditQuery selects audit records for [Client.Audit]. Every field is
// optional.
type AuditQuery struct {
	Device string // id in any form, or alias
	Tool   string
	Caller string // API key id, or "local"
	// Outcome is an exact outcome (ok, tool_error, a gateway error code),
	// or "error" for every outcome but ok.
	Outcome string
	Since   string // RFC 3339 time, or an age such as 1h or 7d
	Before  string // the Next of a previous page
	Limit   int    // default 100, at most 1000
}

// Audit reads one page of the audit log, newest first.
func (c *Client) Audit(ctx context.Context, q AuditQuery) (*AuditPage, error) {
	v := url.Values{}
	for k, s := range map[string]string{"device": q.Device, "tool": q.Tool, "caller": q.Caller, "outcome": q.Outcome, "since": q.Since, "before": q.Before} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	p := "/api/v1/audit"
	if len(v) > 0 {
		p += "?" + v.Encode()
	}
	var out AuditPage
	if err := c.do(ctx, http.MethodGet, p, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
