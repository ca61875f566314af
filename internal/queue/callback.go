package queue

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/mcpgate/mcpgate/internal/redact"
	"github.com/mcpgate/mcpgate/internal/store"
)

// Callback headers.
const (
	SignatureHeader = "X-Mcpgate-Signature" // "sha256=" and the hex HMAC-SHA256 of the body
	CallIDHeader    = "X-Mcpgate-Call-Id"
)

// maxCallbackBackoff caps the wait between two tries of a callback.
const maxCallbackBackoff = 5 * time.Minute

// callbackClaimSlack is how long past its post's timeout a claim on a
// callback lasts: time to record the try.
const callbackClaimSlack = 10 * time.Second

// Sign returns the signature header's value for body under secret.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// runCallbacks posts due callbacks until ctx ends: on each sweep, and when
// a call with a callback ends.
func (q *Queue) runCallbacks(ctx context.Context) {
	tick := time.NewTicker(q.cfg.SweepInterval)
	defer tick.Stop()
	for {
		q.postDue(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-q.callbacks:
		}
	}
}

func (q *Queue) postDue(ctx context.Context) {
	wctx := context.WithoutCancel(ctx)
	due, err := q.st.QueuedCalls(wctx, store.CallQuery{CallbackDue: time.Now().UTC(), Limit: 50})
	if err != nil {
		q.warnStore("reading due callbacks", err)
		return
	}
	q.storeOK("reading due callbacks")
	for _, c := range due {
		if ctx.Err() != nil {
			return
		}
		// Every node of a cluster sweeps the same store: the one whose
		// claim takes posts, and the others do not see the callback due
		// again until the claim runs out (a node that died posting it).
		claim := time.Now().UTC().Add(q.cfg.CallbackTimeout + callbackClaimSlack)
		if ok, err := q.st.ClaimCallback(wctx, c, claim); err != nil {
			q.warnStore("claiming a callback", err)
			return
		} else if !ok {
			continue
		}
		c.CallbackNext = claim
		perr := q.post(ctx, c)
		if perr != nil && ctx.Err() != nil {
			return // cut by shutdown: not a try; the next run posts it
		}
		c.CallbackAttempts++
		switch {
		case perr == nil:
			c.CallbackState, c.CallbackNext = store.CallbackDelivered, time.Time{}
		case c.CallbackAttempts >= q.cfg.CallbackTries:
			c.CallbackState, c.CallbackNext = store.CallbackFailed, time.Time{}
			q.log.Warn("callback failed for good", "call_id", c.ID, "tries", c.CallbackAttempts, "error", perr)
		default:
			wait := min(q.cfg.CallbackBackoff<<(c.CallbackAttempts-1), maxCallbackBackoff)
			c.CallbackNext = time.Now().UTC().Add(wait)
			q.log.Info("callback failed; will retry", "call_id", c.ID, "try", c.CallbackAttempts, "retry_in", wait, "error", perr)
		}
		// From the call's own final state: only the callback columns change.
		if err := q.st.UpdateCall(wctx, c, c.State, nil); err != nil {
			q.log.Warn("recording a callback", "call_id", c.ID, "error", err)
		}
	}
}

// post sends the call to its callback URL once; a 2xx answer is success.
func (q *Queue) post(ctx context.Context, c store.QueuedCall) error {
	alias := ""
	if d, err := q.hub.Device(c.Device); err == nil {
		alias = d.Alias
	}
	body, err := json.Marshal(View(c, alias))
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, q.cfg.CallbackTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(pctx, http.MethodPost, c.CallbackURL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "mcpgate-callback")
	req.Header.Set(CallIDHeader, c.ID)
	if c.CallbackSecret != "" {
		req.Header.Set(SignatureHeader, Sign(c.CallbackSecret, body))
	}
	resp, err := q.cfg.HTTPClient.Do(req)
	if err != nil {
		return redact.Err(err) // its URL may hold the receiver's token: logged
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("callback answered %s", resp.Status)
	}
	return nil
}

// Call is a queued call as the REST API and callbacks show it.
type Call struct {
	ID        string          `json:"id"`
	Seq       int64           `json:"seq"`
	Device    string          `json:"device"`
	Alias     string          `json:"alias,omitempty"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments"`
	State     string          `json:"state"`
	Reason    string          `json:"reason,omitempty"`
	Error     string          `json:"error,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Caller    string          `json:"caller"`
	Door      string          `json:"door,omitempty"`
	Attempts  int             `json:"attempts"`
	// Node is the cluster node that last started the call; "" on one node.
	Node       string        `json:"node,omitempty"`
	TimeoutMS  int64         `json:"timeout_ms,omitempty"`
	QueuedAt   time.Time     `json:"queued_at"`
	ExpiresAt  time.Time     `json:"expires_at"`
	StartedAt  *time.Time    `json:"started_at,omitempty"`
	FinishedAt *time.Time    `json:"finished_at,omitempty"`
	Callback   *CallbackInfo `json:"callback,omitempty"`
}

// CallbackInfo is a call's callback progress; the secret is never shown.
type CallbackInfo struct {
	URL      string `json:"url"`
	State    string `json:"state,omitempty"`
	Attempts int    `json:"attempts"`
}

// View is c as shown to callers.
func View(c store.QueuedCall, alias string) Call {
	v := Call{ID: c.ID, Seq: c.Seq, Device: c.Device, Alias: alias, Tool: c.Tool, Arguments: c.Arguments,
		State: string(c.State), Reason: c.Reason, Error: c.Error, Result: c.Result, Caller: c.Caller, Door: c.Door,
		Attempts: c.Attempts, Node: c.Node, TimeoutMS: c.TimeoutMS, QueuedAt: c.QueuedAt, ExpiresAt: c.ExpiresAt}
	if !c.StartedAt.IsZero() {
		t := c.StartedAt
		v.StartedAt = &t
	}
	if !c.FinishedAt.IsZero() {
		t := c.FinishedAt
		v.FinishedAt = &t
	}
	if c.CallbackURL != "" {
		v.Callback = &CallbackInfo{URL: c.CallbackURL, State: c.CallbackState, Attempts: c.CallbackAttempts}
	}
	return v
}

// ViewFor is View as caller may see it: the callback URL, whose password or
// query may be a webhook's token, whole only for the caller that gave it.
func ViewFor(c store.QueuedCall, alias, caller string) Call {
	v := View(c, alias)
	if v.Callback != nil && caller != c.Caller {
		v.Callback.URL = redact.RawURL(v.Callback.URL)
	}
	return v
}
