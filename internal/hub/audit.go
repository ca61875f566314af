package hub

import (
	"bytes"
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// CallRecord describes one finished tool call, for the audit log: every call
// through [Hub.Call], from any door, whether it reached the device or was
// refused before (unknown device, invalid arguments...).
type CallRecord struct {
	Start  time.Time // when the call entered the hub
	Caller string    // the API key id, or "local"
	Door   string    // "rest", "mcp", "agent"...
	// Device is the normalised id of the device called; when the request
	// named no known device, the reference normalised if it is an id, else
	// as given.
	Device string
	// Tool is the tool's name as the call gave it, cut to
	// mcpclient.MaxToolName bytes (the doors refuse longer names, but the
	// record stays bounded whatever reaches the hub).
	Tool string
	// Arguments are the arguments as the caller sent them ({} when none).
	// The slice belongs to the caller's request: a hook that keeps it past
	// its return must copy it.
	Arguments json.RawMessage
	// Outcome is "ok", "tool_error" (the device reported a failure) or the
	// gateway error's code (see [Code]).
	Outcome string
	Latency time.Duration
	// ErrorCode is "" for a success, the gateway error's code, or for a
	// tool error the device's JSON-RPC error code when it sent one, else
	// "tool_error".
	ErrorCode string
	// Error is the message of the gateway error or of the device's failure,
	// cut to maxErrorText bytes.
	Error string
	// CallID and QueuedAt name a queued call and say when it was queued
	// (docs/queued-calls.md); Start is then when it was delivered, or when
	// it ended undelivered.
	CallID   string
	QueuedAt time.Time
	// Node is the cluster node that took the call (Config.NodeID), ServedBy
	// the one that ran or refused it: another node for a call routed there
	// (docs/cluster.md). Empty on a single node.
	Node, ServedBy string
}

// maxErrorText bounds the error text of a CallRecord: a device may send
// megabytes of error text, and the audit log is not the place for them.
const maxErrorText = 1024

// callRecord builds the audit record of a finished call. dev is nil when
// the call was refused before its device was found, or named none the hub
// knows.
func (h *Hub) callRecord(req CallRequest, start time.Time, dev *device, outcome string, res *mcpclient.Result, err error) CallRecord {
	args := bytes.TrimSpace(req.Arguments)
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	rec := CallRecord{Start: start.UTC(), Caller: req.Caller, Door: req.Door, Tool: truncateText(req.Tool, mcpclient.MaxToolName),
		Arguments: args, Outcome: outcome, Latency: time.Since(start), Node: h.cfg.NodeID, ServedBy: h.cfg.NodeID}
	if rec.Caller == "" {
		rec.Caller = "local"
	}
	if dev != nil {
		rec.Device = dev.id // immutable once created: no lock needed
	} else if id, ok := h.known(req.Device); ok {
		// Refused before the device was looked up (a caller's rate, a
		// device or tool beyond its key): an alias is recorded as the id
		// it names, so the log is searched by device alike.
		rec.Device = id
	} else if id, nerr := xiaozhi.NormalizeDeviceID(req.Device); nerr == nil {
		rec.Device = id
	} else {
		rec.Device = truncateText(req.Device, 256)
	}
	switch {
	case err != nil:
		rec.ErrorCode, rec.Error = outcome, truncateText(err.Error(), maxErrorText)
	case res != nil && res.IsError:
		rec.ErrorCode, rec.Error = "tool_error", truncateText(toolErrorText(res), maxErrorText)
		if res.RPCError != nil && res.RPCError.Code != nil {
			rec.ErrorCode = strconv.FormatInt(int64(*res.RPCError.Code), 10)
		}
	}
	return rec
}

// toolErrorText is the device's own words for a failure: its JSON-RPC
// error message, or the text of its first text content item.
func toolErrorText(res *mcpclient.Result) string {
	if res.RPCError != nil {
		return res.RPCError.Message
	}
	for _, c := range res.Content {
		var item struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(c, &item) == nil && item.Type == "text" {
			return item.Text
		}
	}
	return ""
}

// truncateText cuts s to at most n bytes on a rune boundary, marking the cut.
func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
