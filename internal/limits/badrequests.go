package limits

// Doors as the "door" label of mcpgate_bad_requests_total carries them.
const (
	DoorREST   = "rest"
	DoorMCP    = "mcp"
	DoorOTA    = "ota"
	DoorVision = "vision"
)

// BadRequest counts one malformed request refused at door for reason, in
// mcpgate_bad_requests_total{door,reason}, and logs msg with attrs at info
// level at most once per LogInterval per door and reason, with the number
// not logged since ("suppressed"). A client's malformed request is answered
// 4xx and is not an operator's event one by one, but a flood of them is: the
// counter shows it and the log line says what it was without flooding the
// log. reason must come from a fixed set (it is a metric label), never from
// the request.
func (r *Reporter) BadRequest(door, reason, msg string, attrs ...any) {
	r.m.BadRequests.WithLabelValues(door, reason).Inc()
	suppressed, ok := r.sample("bad_request/" + door + "/" + reason)
	if !ok {
		return
	}
	attrs = append(attrs, "door", door, "reason", reason)
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	r.log.Info(msg, attrs...)
}

// sample reports whether key may log now (at most once per LogInterval) and
// how many lines it did not log since its last one.
func (r *Reporter) sample(key string) (suppressed int, ok bool) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.state[key]
	if st == nil {
		st = &logState{}
		r.state[key] = st
	}
	if !st.last.IsZero() && now.Sub(st.last) < LogInterval {
		st.suppressed++
		return 0, false
	}
	suppressed = st.suppressed
	st.last, st.suppressed = now, 0
	return suppressed, true
}
