package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/duration"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/queue"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// The values of CallBody.Deliver.
const (
	DeliverNow   = "now"
	DeliverQueue = "queue"
)

// CallList is the body of GET /api/v1/calls.
type CallList struct {
	Calls []queue.Call `json:"calls"`
	// Next, when more calls match, is the after of the next page.
	Next string `json:"next,omitempty"`
}

// queueCall answers a call with "deliver":"queue" (or a tool whose policy
// is always): live when the device is online, else stored, 202 Accepted.
func (a *API) queueCall(w http.ResponseWriter, r *http.Request, body CallBody, p *auth.Principal, timeout time.Duration) {
	start := time.Now()
	q := a.cfg.Queue
	if q == nil {
		writeError(w, http.StatusServiceUnavailable, "queue_unavailable", "this gateway does not queue calls", nil)
		return
	}
	var ttl time.Duration
	if body.TTL != "" {
		var err error
		// 0 would mean the default TTL, surely not what "0s" asked for.
		if ttl, err = duration.Parse(body.TTL); err != nil || ttl <= 0 {
			writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf(`"ttl" %q: want a positive duration such as "90s", "2h" or "1d" (leave it out for the default)`, body.TTL), nil)
			return
		}
	}
	req := queue.Request{CallRequest: hub.CallRequest{Device: r.PathValue("id"), Tool: body.Name, Arguments: body.Arguments,
		Timeout: timeout, Caller: p.Caller(), Door: "rest", Wait: body.Wait},
		TTL: ttl, CallbackURL: body.CallbackURL, CallbackSecret: body.CallbackSecret}
	if err := q.CheckOptions(req); err != nil {
		writeQueueError(w, err)
		return
	}
	d, err := a.hub.Device(req.Device)
	if err != nil {
		a.hub.RecordRefused(req.CallRequest, start, hub.Code(err), err) // as a live call to it would be
		writeHubError(w, err)
		return
	}
	if d.Online {
		live := req.CallRequest
		live.QueueIfOffline = true // audited once, as the queued call
		res, err := a.hub.Call(r.Context(), live)
		switch {
		case err == nil:
			writeJSON(w, http.StatusOK, res)
			return
		case !hub.Unreached(err):
			writeHubError(w, err)
			return
		}
		// Gone offline since, or while it waited for a slot: queue it
		// after all.
	}
	c, err := q.Submit(r.Context(), req)
	if err != nil {
		writeQueueError(w, err)
		return
	}
	w.Header().Set("Location", "/api/v1/calls/"+c.ID)
	writeJSON(w, http.StatusAccepted, queue.View(c, d.Alias))
	return
}

// writeQueueError maps a queue error to its status and slug; hub errors as
// writeHubError.
func writeQueueError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, queue.ErrNotFound):
		writeError(w, http.StatusNotFound, "call_not_found", err.Error(), nil)
	case errors.Is(err, queue.ErrNotCancellable):
		writeError(w, http.StatusConflict, "call_not_cancellable", err.Error(), nil)
	case errors.Is(err, queue.ErrFull):
		writeError(w, http.StatusTooManyRequests, "queue_full", err.Error(), nil)
	case errors.Is(err, queue.ErrBadRequest):
		writeError(w, http.StatusBadRequest, "bad_request", err.Error(), nil)
	case hub.Code(err) != "internal":
		writeHubError(w, err)
	default:
		writeError(w, http.StatusServiceUnavailable, "store_error", err.Error(), nil)
	}
}

// visibleCall reports whether the principal may see a call: its device and
// tool must match the key's patterns.
func (a *API) visibleCall(p *auth.Principal, c store.QueuedCall) (alias string, ok bool) {
	if d, err := a.hub.Device(c.Device); err == nil {
		alias = d.Alias
	}
	return alias, p.CanSeeDevice(c.Device, alias) && p.CanSeeTool(c.Tool)
}

// lookupCall finds a call the principal may see, answering 404 otherwise.
func (a *API) lookupCall(w http.ResponseWriter, r *http.Request) (store.QueuedCall, string, bool) {
	if a.cfg.Queue == nil {
		writeError(w, http.StatusServiceUnavailable, "queue_unavailable", "this gateway does not queue calls", nil)
		return store.QueuedCall{}, "", false
	}
	id := r.PathValue("call")
	c, err := a.cfg.Queue.Get(r.Context(), id)
	if err != nil {
		writeQueueError(w, err)
		return store.QueuedCall{}, "", false
	}
	alias, ok := a.visibleCall(principal(r), c)
	if !ok {
		// As for a call that does not exist: a key learns nothing beyond its reach.
		writeQueueError(w, fmt.Errorf("%w: %q", queue.ErrNotFound, id))
		return store.QueuedCall{}, "", false
	}
	return c, alias, true
}

func (a *API) getCall(w http.ResponseWriter, r *http.Request) {
	c, alias, ok := a.lookupCall(w, r)
	if ok {
		writeJSON(w, http.StatusOK, queue.ViewFor(c, alias, principal(r).Caller()))
	}
}

func (a *API) cancelCall(w http.ResponseWriter, r *http.Request) {
	c, alias, ok := a.lookupCall(w, r)
	if !ok {
		return
	}
	c, err := a.cfg.Queue.Cancel(r.Context(), c.ID, principal(r).Caller())
	if err != nil {
		writeQueueError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, queue.ViewFor(c, alias, principal(r).Caller()))
}

func (a *API) listCalls(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Queue == nil {
		writeError(w, http.StatusServiceUnavailable, "queue_unavailable", "this gateway does not queue calls", nil)
		return
	}
	p := principal(r)
	qv := r.URL.Query()
	var query store.CallQuery
	var unknown error // the device is not known: only calls queued for it before it was forgotten
	if ref := qv.Get("device"); ref != "" {
		d, err := a.hub.Device(ref)
		if errors.Is(err, hub.ErrDeviceNotFound) {
			if id, nerr := xiaozhi.NormalizeDeviceID(ref); nerr == nil {
				d, unknown, err = hub.Device{ID: id}, err, nil
			}
		}
		if err == nil && !p.CanSeeDevice(d.ID, d.Alias) {
			err = fmt.Errorf("%w: %q", hub.ErrDeviceNotFound, ref)
		}
		if err != nil {
			writeHubError(w, err)
			return
		}
		query.Device = d.ID
	}
	if s := qv.Get("state"); s != "" {
		st := store.CallState(s)
		if !st.Valid() {
			writeError(w, http.StatusBadRequest, "bad_request",
				fmt.Sprintf("state %q: want queued, running, done, failed, expired or cancelled", s), nil)
			return
		}
		query.States = []store.CallState{st}
	}
	if s := qv.Get("after"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("after %q: want the seq of a listed call (a number of at least 0)", s), nil)
			return
		}
		query.After = n
	}
	if s := qv.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > store.MaxAuditLimit {
			writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("limit %q: want a number from 1 to %d", s, store.MaxAuditLimit), nil)
			return
		}
		query.Limit = n
	}
	// A key limited to some devices or tools sees only theirs: read on past
	// calls it may not see, so that a page is full unless the list ends,
	// and to one call past the page, which says whether there are more.
	want := query.Limit
	if want <= 0 {
		want = store.DefaultAuditLimit
	}
	out := CallList{Calls: make([]queue.Call, 0)}
	for more := false; !more; {
		query.Limit = min(want+1, store.MaxAuditLimit)
		calls, err := a.cfg.Queue.List(r.Context(), query)
		if err != nil {
			writeQueueError(w, err)
			return
		}
		for _, c := range calls {
			alias, ok := a.visibleCall(p, c)
			if !ok {
				continue
			}
			if len(out.Calls) == want {
				out.Next, more = strconv.FormatInt(out.Calls[want-1].Seq, 10), true
				break
			}
			out.Calls = append(out.Calls, queue.ViewFor(c, alias, p.Caller()))
		}
		if len(calls) < query.Limit {
			break
		}
		query.After = calls[len(calls)-1].Seq
	}
	if unknown != nil && len(out.Calls) == 0 && qv.Get("after") == "" && !a.anyCall(r, p, query.Device) {
		writeHubError(w, unknown) // a typo, most likely: the door suggests the device meant
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// anyCall reports whether device has a call p may see, in any state: a
// forgotten device's calls filtered down to none are not a typo of its id.
func (a *API) anyCall(r *http.Request, p *auth.Principal, device string) bool {
	calls, err := a.cfg.Queue.List(r.Context(), store.CallQuery{Device: device, Limit: store.DefaultAuditLimit})
	if err != nil {
		return false
	}
	for _, c := range calls {
		if _, ok := a.visibleCall(p, c); ok {
			return true
		}
	}
	return false
}
