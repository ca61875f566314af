package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// CallState is where a queued call is in its life (docs/queued-calls.md).
type CallState string

// The states of a queued call. Queued and running are live; the others are
// final and never change again.
const (
	CallQueued    CallState = "queued"
	CallRunning   CallState = "running"
	CallDone      CallState = "done"
	CallFailed    CallState = "failed"
	CallExpired   CallState = "expired"
	CallCancelled CallState = "cancelled"
)

// Final reports whether s is an end state.
func (s CallState) Final() bool {
	switch s {
	case CallDone, CallFailed, CallExpired, CallCancelled:
		return true
	}
	return false
}

// Valid reports whether s is one of the six states.
func (s CallState) Valid() bool { return s == CallQueued || s == CallRunning || s.Final() }

// The callback states of a queued call with a callback URL.
const (
	CallbackPending   = "pending"   // final, not delivered yet
	CallbackDelivered = "delivered" // a 2xx answer came
	CallbackFailed    = "failed"    // every try failed
)

// ReasonInterrupted is the reason of a call found running when the queue
// starts: the gateway stopped while it was on the device, so whether the
// device ran it is unknown, and it is never sent again.
const ReasonInterrupted = "interrupted"

// ErrStateChanged is returned by UpdateCall when the call is no longer in
// the state the caller expected: someone else moved it first.
var ErrStateChanged = errors.New("call state changed")

// CallAudit is the audit record of a call that has just ended. The store
// appends it in the transaction that stores the call's final state, so a
// crash leaves both or neither (docs/queued-calls.md, "Audit").
type CallAudit func(QueuedCall) AuditRecord

// endAudit is the record to append with c's update from state from: none
// unless c ends there.
func endAudit(c QueuedCall, from CallState, audit CallAudit) []AuditRecord {
	if audit == nil || !c.State.Final() || from.Final() {
		return nil
	}
	return []AuditRecord{audit(c)}
}

// auditAll is the records of calls that have just ended.
func auditAll(calls []QueuedCall, audit CallAudit) []AuditRecord {
	if audit == nil {
		return nil
	}
	recs := make([]AuditRecord, len(calls))
	for i, c := range calls {
		recs[i] = audit(c)
	}
	return recs
}

// QueuedCall is a tool call stored until its device is online.
type QueuedCall struct {
	Seq       int64  // assigned by CreateCall, increasing: the queue order
	ID        string // public, unique
	Device    string // normalised device id
	Tool      string
	Arguments json.RawMessage // a JSON object, as the caller sent it
	TimeoutMS int64           // the caller's timeout; 0: the tool's
	Caller    string          // API key id, or "local"
	Door      string
	State     CallState
	// Reason is a failed call's error code ("interrupted", "tool_not_found"...).
	Reason string
	Error  string
	// Result is the device's CallToolResult (JSON) of a done call.
	Result   json.RawMessage
	Attempts int // times it was marked running
	// Node is the cluster node that last marked it running ("" on a single
	// node): only that node interrupts it when it starts again.
	Node string

	QueuedAt, ExpiresAt, StartedAt, FinishedAt time.Time

	CallbackURL      string
	CallbackSecret   string
	CallbackState    string // "", or one of the Callback* states
	CallbackAttempts int
	CallbackNext     time.Time // earliest next try of a pending callback
}

// CallQuery selects queued calls, in queue order (oldest first).
type CallQuery struct {
	Device string      // exact normalised id; "" for all
	Caller string      // exact caller; "" for all
	States []CallState // any of these; none for all
	After  int64       // only Seq > After, for paging; 0: no bound
	// CallbackDue, when not zero, selects calls whose callback is pending
	// and due at that time.
	CallbackDue time.Time
	Limit       int // default 100, at most 1000
}

func callLimit(n int) int { return auditLimit(n) }

// callColumns are the columns every read returns, in scan order.
const callColumns = `seq, id, device, tool, arguments, timeout_ms, caller, door, state, reason, error, result, attempts,
	queued_at, expires_at, started_at, finished_at,
	callback_url, callback_secret, callback_state, callback_attempts, callback_next, node`

// callsSQL builds the query of q; ph and timeArg as for auditSQL.
func callsSQL(q CallQuery, ph func(n int) string, timeArg func(time.Time) any) (string, []any) {
	var where []string
	var args []any
	add := func(cond string, arg any) {
		args = append(args, arg)
		where = append(where, fmt.Sprintf(cond, ph(len(args))))
	}
	if q.Device != "" {
		add("device = %s", q.Device)
	}
	if q.Caller != "" {
		add("caller = %s", q.Caller)
	}
	if len(q.States) > 0 {
		var in []string
		for _, s := range q.States {
			args = append(args, string(s))
			in = append(in, ph(len(args)))
		}
		where = append(where, "state IN ("+strings.Join(in, ", ")+")")
	}
	if q.After > 0 {
		add("seq > %s", q.After)
	}
	if !q.CallbackDue.IsZero() {
		add("callback_state = %s", CallbackPending)
		add("(callback_next IS NULL OR callback_next <= %s)", timeArg(q.CallbackDue))
	}
	var b strings.Builder
	b.WriteString("SELECT " + callColumns + " FROM calls")
	if len(where) > 0 {
		b.WriteString(" WHERE ")
		b.WriteString(strings.Join(where, " AND "))
	}
	args = append(args, callLimit(q.Limit))
	fmt.Fprintf(&b, " ORDER BY seq LIMIT %s", ph(len(args)))
	return b.String(), args
}

// validateCall checks what every backend needs of a new call.
func validateCall(c QueuedCall) error {
	switch {
	case c.ID == "":
		return errors.New("store: call without an ID")
	case c.Device == "" || c.Tool == "":
		return fmt.Errorf("store: call %s without a device or tool", c.ID)
	case c.State != CallQueued:
		return fmt.Errorf("store: call %s: a new call is queued, not %q", c.ID, c.State)
	case c.QueuedAt.IsZero() || c.ExpiresAt.IsZero():
		return fmt.Errorf("store: call %s without queued and expiry times", c.ID)
	case !json.Valid(c.Arguments):
		return fmt.Errorf("store: call %s: arguments are not valid JSON", c.ID)
	}
	return nil
}

func callResult(r json.RawMessage) any {
	if len(r) == 0 {
		return nil
	}
	return string(r)
}

// interruptedText is the error of a call found running at start.
const interruptedText = "the gateway stopped while the call was on the device; whether it ran is unknown, and it is not sent again"
