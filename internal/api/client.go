package api

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/queue"
)

// ErrUnreachable wraps a failure to connect to the gateway at all (refused,
// unresolvable host), as opposed to an answer the gateway gave (an [*APIError]).
var ErrUnreachable = errors.New("cannot reach the gateway")

// ErrNoAnswer is a gateway that took the connection and did not answer
// within the client's wait.
var ErrNoAnswer = errors.New("no answer from the gateway")

// ErrNotGateway wraps an answer that is not the gateway's JSON (a web
// server's HTML page, a proxy's error page): the URL names something else.
var ErrNotGateway = errors.New("not a gateway's API")

// APIError is a non-2xx answer of the gateway, decoded from the error body
// {"error":{"code","message","details"}}. An answer of another shape is
// [ErrNotGateway] instead.
type APIError struct {
	Status  int
	Code    string
	Message string
	// Details is the error's details member as sent, if any. For
	// invalid_arguments it is a [ValidationDetails]; see [APIError.Problems].
	Details json.RawMessage
}

func (e *APIError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("HTTP %d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
	}
	return e.Code + ": " + e.Message
}

// Problems returns the schema violations of an invalid_arguments error, or
// nil for any other error.
func (e *APIError) Problems() []hub.Problem {
	if e.Code != "invalid_arguments" || len(e.Details) == 0 {
		return nil
	}
	var d ValidationDetails
	if json.Unmarshal(e.Details, &d) != nil {
		return nil
	}
	return d.Problems
}

// Client is a typed client of the REST API. It is safe for concurrent use.
//
// Every method is bound by its ctx and nothing else: a tool call may wait as
// long as the gateway's call timeout, so give ctx a deadline longer than the
// call's timeout_ms to see the gateway's device_timeout rather than your own.
type Client struct {
	base string // scheme://host[/prefix], no trailing slash
	hc   *http.Client
}

// NewClient returns a client of the gateway at baseURL, such as
// "http://127.0.0.1:8000" or "https://gw.example.com/mcpgate". A bare
// "host:port" means http. A nil httpClient means http.DefaultClient.
func NewClient(baseURL string, httpClient *http.Client) (*Client, error) {
	raw := strings.TrimSpace(baseURL)
	if raw == "" {
		return nil, errors.New("api: empty gateway URL")
	}
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("api: gateway URL %q: %w", baseURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("api: gateway URL %q: scheme must be http or https", baseURL)
	}
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("api: gateway URL %q has no host", baseURL)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("api: gateway URL %q: want only scheme, host and an optional path prefix", baseURL)
	}
	if httpClient == nil {
		httpClient = http.DefaultClient
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	return &Client{base: u.String(), hc: httpClient}, nil
}

// WithKey returns a client that sends secret, an API key, as
// "Authorization: Bearer <secret>" on every request (its event streams
// included). An empty secret returns c unchanged.
func (c *Client) WithKey(secret string) *Client {
	if secret == "" {
		return c
	}
	hc := *c.hc
	next := hc.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	host := ""
	if u, err := url.Parse(c.base); err == nil {
		host = u.Host
	}
	hc.Transport = bearer{secret: secret, host: host, next: next}
	return &Client{base: c.base, hc: &hc}
}

// bearer adds the API key to requests to the gateway's host that do not
// carry an Authorization header already; a redirect elsewhere never gets it.
type bearer struct {
	secret string
	host   string
	next   http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Header.Get("Authorization") == "" && r.URL.Host == b.host {
		r = r.Clone(r.Context()) // a RoundTripper must not modify the caller's request
		r.Header.Set("Authorization", "Bearer "+b.secret)
	}
	return b.next.RoundTrip(r)
}

// URL returns the gateway's base URL as the client uses it.
func (c *Client) URL() string { return c.base }

// Devices lists every device the gateway knows, online or not, sorted by alias.
func (c *Client) Devices(ctx context.Context) ([]hub.Device, error) {
	var out DeviceList
	if err := c.do(ctx, http.MethodGet, "/api/v1/devices", nil, &out); err != nil {
		return nil, err
	}
	return out.Devices, nil
}

// Device returns one device by id (any MAC form) or alias.
func (c *Client) Device(ctx context.Context, ref string) (*hub.Device, error) {
	p, err := devicePath(ref, "")
	if err != nil {
		return nil, err
	}
	var d hub.Device
	if err := c.do(ctx, http.MethodGet, p, nil, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// SetAlias renames a device and returns it as it now is.
func (c *Client) SetAlias(ctx context.Context, ref, alias string) (*hub.Device, error) {
	p, err := devicePath(ref, "")
	if err != nil {
		return nil, err
	}
	var d hub.Device
	if err := c.do(ctx, http.MethodPatch, p, map[string]string{"alias": alias}, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// RevokeResult is the answer of a revocation.
type RevokeResult struct {
	Device          string    `json:"device"`
	RevokedUntil    time.Time `json:"revoked_until"`
	Disconnected    bool      `json:"disconnected"`
	NotDisconnected string    `json:"not_disconnected,omitempty"`
}

// RevokeTokens revokes every credential issued to a device so far and
// closes its live connection.
func (c *Client) RevokeTokens(ctx context.Context, ref string) (*RevokeResult, error) {
	p, err := devicePath(ref, "/revoke")
	if err != nil {
		return nil, err
	}
	var out RevokeResult
	if err := c.do(ctx, http.MethodPost, p, struct{}{}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Forget forgets a device: the gateway no longer lists it, its tools leave
// every door, and the store drops it. An online device is refused
// (device_online) unless force, which closes its connection first.
func (c *Client) Forget(ctx context.Context, ref string, force bool) (*ForgetResult, error) {
	p, err := devicePath(ref, "")
	if err != nil {
		return nil, err
	}
	if force {
		p += "?force=true"
	}
	var out ForgetResult
	if err := c.do(ctx, http.MethodDelete, p, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Tools returns a device's last known tool catalog.
func (c *Client) Tools(ctx context.Context, ref string) (*ToolList, error) {
	p, err := devicePath(ref, "/tools")
	if err != nil {
		return nil, err
	}
	var out ToolList
	if err := c.do(ctx, http.MethodGet, p, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Call calls a tool. A failure the device reports is a Result with IsError
// set, not an error; gateway failures (unknown tool, invalid arguments,
// offline, timeout...) are an [*APIError]. A call the gateway queued instead
// (the device offline and its tool queued by the gateway's --queue-tool
// "always", though the body did not ask) is a [*QueuedError]: it has not run.
func (c *Client) Call(ctx context.Context, ref string, body CallBody) (*mcpclient.Result, error) {
	res, qc, err := c.CallOrQueue(ctx, ref, body)
	if err != nil {
		return nil, err
	}
	if qc != nil {
		return nil, &QueuedError{Call: qc}
	}
	return res, nil
}

// QueuedError is Call's answer when the gateway queued the call instead of
// running it: it runs on the device's next session (see [Client.QueuedCall]).
type QueuedError struct {
	Call *queue.Call
}

func (e *QueuedError) Error() string {
	return fmt.Sprintf("api: call: not run yet: the device is offline and the gateway queued it as %s", e.Call.ID)
}

// statusOut makes do keep the answer's status and raw body.
type statusOut struct {
	status int
	body   json.RawMessage
}

// CallOrQueue makes a call that may be queued (body.Deliver "queue"): it
// returns the device's result when the call ran at once, or the queued call
// (202 Accepted) when the device was offline.
func (c *Client) CallOrQueue(ctx context.Context, ref string, body CallBody) (*mcpclient.Result, *queue.Call, error) {
	p, err := devicePath(ref, "/tools/call")
	if err != nil {
		return nil, nil, err
	}
	if body.Name == "" {
		return nil, nil, errors.New("api: call: empty tool name")
	}
	var out statusOut
	if err := c.do(ctx, http.MethodPost, p, body, &out); err != nil {
		return nil, nil, err
	}
	if out.status == http.StatusAccepted {
		var qc queue.Call
		if err := json.Unmarshal(out.body, &qc); err != nil {
			return nil, nil, fmt.Errorf("api: call: unexpected answer from %s: %w", c.base, err)
		}
		return nil, &qc, nil
	}
	var res mcpclient.Result
	if err := json.Unmarshal(out.body, &res); err != nil {
		return nil, nil, fmt.Errorf("api: call: unexpected answer from %s: %w", c.base, err)
	}
	return &res, nil, nil
}

// CallQuery selects queued calls for Calls.
type CallQuery struct {
	Device string // id or alias
	State  string
	After  int64
	Limit  int
}

// Calls lists queued calls in queue order.
func (c *Client) Calls(ctx context.Context, q CallQuery) ([]queue.Call, error) {
	page, err := c.CallPage(ctx, q)
	return page.Calls, err
}

// CallPage lists one page of queued calls in queue order, with the After of
// the next page when more calls match.
func (c *Client) CallPage(ctx context.Context, q CallQuery) (CallList, error) {
	v := url.Values{}
	if q.Device != "" {
		v.Set("device", q.Device)
	}
	if q.State != "" {
		v.Set("state", q.State)
	}
	if q.After > 0 {
		v.Set("after", fmt.Sprint(q.After))
	}
	if q.Limit > 0 {
		v.Set("limit", fmt.Sprint(q.Limit))
	}
	path := "/api/v1/calls"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var out CallList
	if err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return CallList{}, err
	}
	return out, nil
}

// QueuedCall returns one queued call.
func (c *Client) QueuedCall(ctx context.Context, id string) (*queue.Call, error) {
	var out queue.Call
	if err := c.do(ctx, http.MethodGet, callPath(id), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CancelCall cancels a queued call and returns it.
func (c *Client) CancelCall(ctx context.Context, id string) (*queue.Call, error) {
	var out queue.Call
	if err := c.do(ctx, http.MethodDelete, callPath(id), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func callPath(id string) string { return "/api/v1/calls/" + url.PathEscape(id) }

// Health returns the gateway's /healthz answer.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var h Health
	if err := c.do(ctx, http.MethodGet, "/healthz", nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// devicePath builds /api/v1/devices/{ref}{suffix} with ref escaped as one
// path segment. "." and ".." are refused: the server's mux would clean them
// away and redirect to another endpoint.
func devicePath(ref, suffix string) (string, error) {
	switch strings.TrimSpace(ref) {
	case "":
		return "", errors.New("api: empty device reference: give a device id or alias")
	case ".", "..":
		return "", fmt.Errorf("api: invalid device reference %q", ref)
	}
	return "/api/v1/devices/" + url.PathEscape(ref) + suffix, nil
}

// maxErrorBody caps how much of an error response is read.
const maxErrorBody = 1 << 20

// do sends one request with an optional JSON body and decodes a 2xx answer
// into out, or a non-2xx answer into an *APIError.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("api: encode %s %s request: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("api: %s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return c.decodeAPIError(resp)
	}
	if sp, ok := out.(*statusOut); ok {
		sp.status = resp.StatusCode
		out = &sp.body
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("api: %s %s: %w", method, path, ctx.Err())
		}
		if _, ok := errors.AsType[*json.SyntaxError](err); ok {
			return c.notGateway(resp)
		}
		return fmt.Errorf("api: %s %s: unexpected answer from %s: %w", method, path, c.base, err)
	}
	return nil
}

// send sends req; a request that gets no answer is explained by
// transportError.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	var wrote atomic.Bool // the whole request went out: the gateway has it
	ctx := httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		WroteRequest: func(i httptrace.WroteRequestInfo) { wrote.Store(i.Err == nil) },
	})
	resp, err := c.hc.Do(req.WithContext(ctx))
	if err != nil {
		return nil, c.transportError(req.Context(), err, wrote.Load())
	}
	return resp, nil
}

// transportError explains a request that got no answer; wrote says the
// request went out whole. A refused or unresolvable connection is by far the
// most common case (no gateway running, wrong --server), so it says what to
// do about it.
func (c *Client) transportError(ctx context.Context, err error, wrote bool) error {
	if wrote && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// The caller's deadline passed while the gateway had the request:
		// no answer, as when the transport's own wait ends first.
		return &noAnswerError{base: c.base, deadline: ctx.Err()}
	}
	if ctx.Err() != nil {
		// The caller's deadline or cancellation, not the gateway's fault;
		// err (a *url.Error naming the request) wraps ctx.Err() for errors.Is.
		return fmt.Errorf("api: %w", err)
	}
	var opErr *net.OpError
	var dnsErr *net.DNSError
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() && !(errors.As(err, &opErr) && opErr.Op == "dial") {
		return &noAnswerError{base: c.base}
	}
	if (errors.As(err, &opErr) && opErr.Op == "dial") || errors.As(err, &dnsErr) {
		// The url.Error only repeats the URL; keep its cause, which says why.
		cause := err
		var ue *url.Error
		if errors.As(err, &ue) {
			cause = ue.Err
		}
		return fmt.Errorf("%w at %s: %w (is it running? start it with 'mcpgate serve', or point --server or MCPGATE_SERVER at it)",
			ErrUnreachable, c.base, cause)
	}
	return fmt.Errorf("api: %w", err)
}

// noAnswerError is [ErrNoAnswer]: a gateway that took the request and did
// not answer within the client's wait or before the caller's deadline,
// which it then wraps too.
type noAnswerError struct {
	base     string
	deadline error // the caller's context.DeadlineExceeded, if that ended the wait
}

func (e *noAnswerError) Error() string {
	return fmt.Sprintf("%s: %s took the connection but did not answer in time (is --server a gateway? is it overloaded?)", ErrNoAnswer, e.base)
}

func (e *noAnswerError) Unwrap() []error {
	if e.deadline == nil {
		return []error{ErrNoAnswer}
	}
	return []error{ErrNoAnswer, e.deadline}
}

// notGateway is [ErrNotGateway] for an answer whose body is not the
// gateway's JSON.
func (c *Client) notGateway(resp *http.Response) error {
	hint := "check --server's host, port and path prefix"
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		hint = "a proxy's page? is the gateway behind it running? else " + hint
	}
	return fmt.Errorf("%w at %s: %s %s answered %d %s with %s, not the gateway's JSON (%s)",
		ErrNotGateway, c.base, resp.Request.Method, resp.Request.URL.Path, resp.StatusCode, http.StatusText(resp.StatusCode),
		cmp.Or(resp.Header.Get("Content-Type"), "no content type"), hint)
}

// decodeAPIError decodes a non-2xx answer: an [*APIError] when it is the
// gateway's error body, else [ErrNotGateway].
func (c *Client) decodeAPIError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody)) // a short read still describes the error
	e := &APIError{Status: resp.StatusCode}
	var body struct {
		Error *struct {
			Code    string          `json:"code"`
			Message string          `json:"message"`
			Details json.RawMessage `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &body) == nil && body.Error != nil && body.Error.Code != "" {
		e.Code, e.Message = body.Error.Code, body.Error.Message
		if d := bytes.TrimSpace(body.Error.Details); len(d) > 0 && string(d) != "null" {
			e.Details = d
		}
		return e
	}
	return c.notGateway(resp)
}
