package mcpclient

import (
	"testing"
	"time"
)

// TestMaxIDWraps: a session sharing its device keeps its ids at or below
// MaxID, so another client can have the ids above.
func TestMaxIDWraps(t *testing.T) {
	p := newPipe()
	s := New(t.Context(), p, Config{RequestTimeout: time.Second, MaxID: 1<<30 - 1})
	s.nextID = 1<<30 - 2
	var got []int32
	for range 3 {
		go func() { _, _ = s.Request(t.Context(), "tools/list", nil, 0) }()
		m := p.next(t)
		id, _ := m.ID.Int32()
		got = append(got, id)
		reply(t, s, m, `{}`)
	}
	if got[0] != 1<<30-1 || got[1] != 1 || got[2] != 2 {
		t.Fatalf("ids = %v, want [%d 1 2]", got, 1<<30-1)
	}
}

// TestFirstID: ids start at FirstID; one out of range is 1.
func TestFirstID(t *testing.T) {
	for _, tc := range []struct{ first, max, want int32 }{
		{0, 0, 1}, {1 << 20, 0, 1 << 20}, {5, 4, 1}, {-3, 0, 1},
	} {
		p := newPipe()
		s := New(t.Context(), p, Config{RequestTimeout: time.Second, FirstID: tc.first, MaxID: tc.max})
		var got []int32
		for range 2 {
			go func() { _, _ = s.Request(t.Context(), "tools/list", nil, 0) }()
			m := p.next(t)
			id, _ := m.ID.Int32()
			got = append(got, id)
			reply(t, s, m, `{}`)
		}
		if got[0] != tc.want || got[1] != tc.want+1 {
			t.Errorf("FirstID %d, MaxID %d: ids %v, want %d then %d", tc.first, tc.max, got, tc.want, tc.want+1)
		}
	}
}

// TestAdoptInitialize: a session whose device another client initialized
// sends no initialize of its own and goes straight to tools/list.
func TestAdoptInitialize(t *testing.T) {
	p := newPipe()
	s := New(t.Context(), p, Config{Vision: func() *Vision { return &Vision{URL: "http://gw/vision", Token: "t"} }})
	if s.Initialized() {
		t.Fatal("initialized before anything")
	}
	s.AdoptInitialize(InitializeResult{ProtocolVersion: "2024-11-05", ServerInfo: ServerInfo{Name: "board", Version: "2.4.2"}})
	if !s.Initialized() {
		t.Fatal("not initialized after adopting")
	}
	type result struct {
		d   *Discovery
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := s.Discover(t.Context())
		done <- result{d, err}
	}()
	m := p.next(t)
	if m.Method != "tools/list" {
		t.Fatalf("first request %s, want tools/list", m.Method)
	}
	reply(t, s, m, `{"tools":[{"name":"self.x","inputSchema":{"type":"object"}}]}`)
	r := <-done
	if r.err != nil || r.d.Init.ServerInfo.Name != "board" || len(r.d.Tools) != 1 {
		t.Fatalf("discovery %+v, %v", r.d, r.err)
	}
}
