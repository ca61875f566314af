package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
)

// tableTimeRE matches a time as tables print it: local, with its UTC offset.
var tableTimeRE = regexp.MustCompile(`^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d\d:\d\d`)

func TestAuditCmd(t *testing.T) {
	addr := startGateway(t)
	connect(t, addr, devicetest.Config{Tools: cliCatalog, OnCall: cliAnswer})
	run(t, addr, "devices", "alias", devID, "kitchen").want(t, 0)
	run(t, addr, "call", "kitchen", "self.audio_speaker.set_volume", "volume=30").want(t, 0)
	run(t, addr, "call", "kitchen", "self.fail").want(t, 1)

	// Records reach the store in the background, within about 100 ms.
	var page api.AuditPage
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := run(t, addr, "audit", "--json")
		r.want(t, 0)
		if err := json.Unmarshal([]byte(r.stdout), &page); err != nil {
			t.Fatalf("audit --json: %v\n%s", err, r.stdout)
		}
		if len(page.Records) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit records: %+v", page.Records)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := page.Records[0]; r.Tool != "self.fail" || r.Outcome != "tool_error" || r.Error != "Camera is not available" || r.Alias != "kitchen" {
		t.Errorf("newest record %+v", r)
	}
	// A single node took and served every call.
	for _, r := range page.Records {
		if r.Node == "" || r.ServedBy != r.Node {
			t.Errorf("record of a single node: node %q, served_by %q; want both its id", r.Node, r.ServedBy)
		}
	}
	var args bytes.Buffer
	_ = json.Compact(&args, page.Records[1].Arguments) // --json indents it
	if r := page.Records[1]; r.Tool != "self.audio_speaker.set_volume" || r.Outcome != "ok" || args.String() != `{"volume":30}` || r.Caller != "local" {
		t.Errorf("oldest record %+v", r)
	}

	table := run(t, addr, "audit", "--device", "kitchen")
	table.want(t, 0)
	for _, s := range []string{"TIME", "NODE", page.Records[0].Node, "CALLER", "OUTCOME", "self.audio_speaker.set_volume", `{"volume":30}`, "tool_error: Camera is not available", "kitchen"} {
		if !strings.Contains(table.stdout, s) {
			t.Errorf("table lacks %q:\n%s", s, table.stdout)
		}
	}
	// A table's time says its zone, and --since takes it as printed.
	lines := strings.Split(strings.TrimSpace(table.stdout), "\n")
	at := tableTimeRE.FindString(lines[len(lines)-1])
	if at == "" {
		t.Fatalf("the oldest record's time has no UTC offset:\n%s", table.stdout)
	}
	if since := run(t, addr, "audit", "--since", at); since.code != 0 || !strings.Contains(since.stdout, "set_volume") {
		t.Errorf("--since %q, as the table printed it: %+v", at, since)
	}
	one := run(t, addr, "audit", "--tool", "self.audio_speaker.set_volume", "--since", "1h")
	one.want(t, 0)
	if strings.Contains(one.stdout, "self.fail") || !strings.Contains(one.stdout, "set_volume") {
		t.Errorf("--tool filter:\n%s", one.stdout)
	}
	paged := run(t, addr, "audit", "--limit", "1")
	paged.want(t, 0)
	if !strings.Contains(paged.stderr, "more: mcpgate audit --before ") {
		t.Errorf("no next-page hint:\n%s", paged.stderr)
	}
	next := strings.Fields(paged.stderr)[4]
	rest := run(t, addr, "audit", "--limit", "1", "--before", next)
	rest.want(t, 0)
	if !strings.Contains(rest.stdout, "set_volume") || strings.Contains(rest.stdout, "self.fail") {
		t.Errorf("second page:\n%s", rest.stdout)
	}
	if rest.stderr != "" {
		t.Errorf("the last page, full, says there is more: %q", rest.stderr)
	}
	none := run(t, addr, "audit", "--device", "02:00:00:00:00:99")
	none.want(t, 0)
	if !strings.Contains(none.stderr, "No audit record") {
		t.Errorf("empty result: %+v", none)
	}
	typo := run(t, addr, "audit", "--outcome", "eror")
	typo.want(t, 0)
	if !strings.Contains(typo.stderr, `Is --outcome "eror" a typo? (did you mean error?)`) {
		t.Errorf("--outcome typo: %+v", typo)
	}
	if failed := run(t, addr, "audit", "--outcome", "error"); !strings.Contains(failed.stdout, "self.fail") || failed.stderr != "" {
		t.Errorf("--outcome error: %+v", failed)
	}
	bad := run(t, addr, "audit", "--since", "yesterday")
	bad.want(t, 1)
	if !strings.Contains(bad.stderr, "bad_request") || !strings.Contains(bad.stderr, "RFC 3339") {
		t.Errorf("bad --since: %s", bad.stderr)
	}
}

func TestApplyAuditFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		retention   string
		rows, value int
		wantAge     time.Duration
		wantRows    int
		wantErr     bool
	}{
		{"30d", 1000, 1024, 30 * 24 * time.Hour, 1000, false},
		{"0", 0, 1024, -1, -1, false},
		{"12h", 5, 64, 12 * time.Hour, 5, false},
		{"soon", 5, 1024, 0, 0, true},
		{"1d", -1, 1024, 0, 0, true},
		{"1d", 5, 8, 0, 0, true},
	}
	for _, tt := range tests {
		cfg := gateway.Config{AuditMaxRows: tt.rows, AuditMaxValueBytes: tt.value}
		err := applyAuditFlags(&cfg, tt.retention)
		if (err != nil) != tt.wantErr {
			t.Errorf("%+v: err %v", tt, err)
			continue
		}
		if err == nil && (cfg.AuditRetention != tt.wantAge || cfg.AuditMaxRows != tt.wantRows) {
			t.Errorf("%+v: retention %v rows %d", tt, cfg.AuditRetention, cfg.AuditMaxRows)
		}
	}
}
