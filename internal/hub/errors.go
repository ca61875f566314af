package hub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// Gateway-side failures of a call. Doors map each to their own form (an HTTP
// status, an MCP isError result); a device-side failure is a Result instead.
var (
	ErrDeviceNotFound = errors.New("device not found")
	ErrToolNotFound   = errors.New("tool not found")
	ErrDeviceOffline  = errors.New("device is offline")
	ErrInvalidArgs    = errors.New("invalid arguments")
	ErrAliasTaken     = errors.New("alias already in use")
	ErrBadAlias       = errors.New("invalid alias")
	// ErrDeviceTimeout and ErrDeviceDisconnected come from the engine.
	ErrDeviceTimeout      = mcpclient.ErrTimeout
	ErrDeviceDisconnected = mcpclient.ErrDisconnected
	// ErrReplaced is why an older connection closes when the same device connects again.
	ErrReplaced = errors.New("replaced by a newer connection of the same device")
	// ErrDeviceOnline: a connected device is not forgotten unless forced
	// (Hub.Forget).
	ErrDeviceOnline = errors.New("device is online")
	// ErrStore: the store failed, so the change was not made (Hub.Forget,
	// Hub.SetAlias).
	ErrStore = errors.New("store failed")
	// ErrForgotten is why a device's connection closes when it is forgotten
	// by force.
	ErrForgotten = errors.New("device forgotten")
	// ErrShutdown is why connections close when the gateway stops.
	ErrShutdown = errors.New("gateway shutting down")
	// ErrDeviceBusy: the device's call queue is full. The call was not sent.
	ErrDeviceBusy = errors.New("device is busy")
	// ErrRateLimited: the caller or the device is over its call rate. The
	// call was not sent.
	ErrRateLimited = errors.New("rate limited")
)

// LimitError is a call refused by a limit: it matches ErrDeviceBusy or
// ErrRateLimited with errors.Is, and says which limit (a name of
// internal/limits) and when trying again may succeed.
type LimitError struct {
	Err        error // ErrDeviceBusy or ErrRateLimited
	Limit      string
	RetryAfter time.Duration
	Msg        string // what happened, for people
}

func (e *LimitError) Error() string { return e.Err.Error() + ": " + e.Msg }

// Unwrap returns the sentinel.
func (e *LimitError) Unwrap() error { return e.Err }

// RetryAfter returns when a call refused by a limit may be tried again, and
// whether err is such a refusal.
func RetryAfter(err error) (time.Duration, bool) {
	var le *LimitError
	if errors.As(err, &le) {
		return le.RetryAfter, true
	}
	return 0, false
}

// Problem is one schema violation in a call's arguments.
type Problem struct {
	// Path is a JSON pointer into the arguments ("" for the whole object).
	Path    string `json:"path"`
	Message string `json:"message"`
}

// ValidationError lists why arguments do not match a tool's input schema.
// It matches ErrInvalidArgs with errors.Is.
type ValidationError struct {
	Tool     string
	Problems []Problem
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invalid arguments for %s: ", e.Tool)
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		if p.Path != "" {
			b.WriteString(p.Path)
			b.WriteString(": ")
		}
		b.WriteString(p.Message)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrInvalidArgs) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidArgs }

// codes maps gateway errors to their stable slugs, first match wins.
var codes = []struct {
	err  error
	code string
}{
	{ErrDeviceNotFound, "device_not_found"},
	{ErrToolNotFound, "tool_not_found"},
	{ErrInvalidArgs, "invalid_arguments"},
	{ErrDeviceOffline, "device_offline"},
	{ErrDeviceOnline, "device_online"},
	{ErrStore, "store_error"},
	{ErrDeviceTimeout, "device_timeout"},
	{ErrDeviceDisconnected, "device_disconnected"},
	{ErrDeviceBusy, "device_busy"},
	{ErrRateLimited, "rate_limited"},
	{ErrAliasTaken, "alias_taken"},
	{ErrBadAlias, "bad_request"},
	{mcpclient.ErrMalformedResponse, "device_bad_response"},
	{context.Canceled, "client_closed"},
	{context.DeadlineExceeded, "client_closed"},
}

// Code returns the stable slug of a gateway error, as the REST API and
// metrics name it, or "internal" for an unknown one.
func Code(err error) string {
	if err == nil {
		return "ok"
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "internal"
}

// Codes lists every slug [Code] returns, "ok" first.
func Codes() []string {
	out := []string{"ok"}
	for _, c := range codes {
		if !slices.Contains(out, c.code) {
			out = append(out, c.code)
		}
	}
	return append(out, "internal")
}
