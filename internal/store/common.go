package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Audit query limits (see AuditQuery.Limit).
const (
	DefaultAuditLimit = 100
	MaxAuditLimit     = 1000
)

// ErrExists is returned by CreateKey when a key with the same ID exists.
var ErrExists = errors.New("already exists")

func auditLimit(n int) int {
	switch {
	case n <= 0:
		return DefaultAuditLimit
	case n > MaxAuditLimit:
		return MaxAuditLimit
	}
	return n
}

// auditSQL builds the audit query of q. ph returns the placeholder of the
// nth argument (1-based): "?" for SQLite, "$n" for PostgreSQL; timeArg
// converts Since to the backend's column type.
func auditSQL(q AuditQuery, ph func(n int) string, timeArg func(time.Time) any) (string, []any) {
	var where []string
	var args []any
	add := func(cond string, arg any) {
		args = append(args, arg)
		where = append(where, fmt.Sprintf(cond, ph(len(args))))
	}
	if q.Device != "" {
		add("device = %s", q.Device)
	}
	if q.Tool != "" {
		add("tool = %s", q.Tool)
	}
	if q.Caller != "" {
		add("caller = %s", q.Caller)
	}
	switch q.Outcome {
	case "":
	case "error":
		add("outcome <> %s", "ok")
	default:
		add("outcome = %s", q.Outcome)
	}
	if !q.Since.IsZero() {
		add("time >= %s", timeArg(q.Since))
	}
	if q.Before > 0 {
		add("seq < %s", q.Before)
	}
	var b strings.Builder
	b.WriteString("SELECT seq, time, caller, door, device, tool, arguments, outcome, latency_ms, error_code, error, call_id, queued_at, node, served_by FROM audit")
	if len(where) > 0 {
		b.WriteString(" WHERE ")
		b.WriteString(strings.Join(where, " AND "))
	}
	args = append(args, auditLimit(q.Limit))
	fmt.Fprintf(&b, " ORDER BY seq DESC LIMIT %s", ph(len(args)))
	return b.String(), args
}

// validateKey checks what every backend needs of a new key.
func validateKey(k APIKey) error {
	if k.ID == "" {
		return errors.New("store: key without an ID")
	}
	if len(k.Hash) == 0 {
		return fmt.Errorf("store: key %s without a hash", k.ID)
	}
	return nil
}

// emptyNil turns an empty list into nil, so that a key's lists read back
// the same whichever backend and however they were written.
func emptyNil(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}

func validateCatalog(hash string, tools json.RawMessage) error {
	if hash == "" {
		return errors.New("store: catalog without a hash")
	}
	if !json.Valid(tools) {
		return fmt.Errorf("store: catalog %s: tools are not valid JSON", hash)
	}
	return nil
}
