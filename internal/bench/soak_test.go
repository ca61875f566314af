package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// A short soak against an in-process gateway: every answered call has its
// audit row, matched by device, arguments and outcome.
func TestSoakInProcess(t *testing.T) {
	t.Parallel()
	rep, err := Run(context.Background(), Config{
		InProcess:  true,
		Devices:    5,
		Soak:       3 * time.Second,
		SoakRate:   20,
		SoakSample: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Soak
	if s == nil {
		t.Fatal("no soak report")
	}
	if s.Calls < 20 || s.Outcomes["ok"] == 0 {
		t.Fatalf("soak answered %d calls (%v), want about 60 and some ok", s.Calls, s.Outcomes)
	}
	if !s.Audit.Available || !s.Audit.OK || s.Audit.Rows != s.Calls {
		t.Fatalf("audit check: %+v for %d calls", s.Audit, s.Calls)
	}
	if len(s.Samples) < 3 {
		t.Errorf("%d memory samples in 3 s at 0.5 s", len(s.Samples))
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"soak ", "calls ", "memory ", "audit       ok:"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("soak report lacks %q:\n%s", want, text.String())
		}
	}
	if _, err := json.Marshal(rep); err != nil {
		t.Errorf("report does not marshal: %v", err)
	}
}

func TestMatchAudit(t *testing.T) {
	a := auditKey("02:be:00:00:00:01", []byte(`{"volume": 3}`), "ok")
	b := auditKey("02:be:00:00:00:01", []byte(`{"volume":4}`), "ok")
	c := auditKey("02:be:00:00:00:02", []byte(`{"volume":3}`), "device_offline")
	for _, tc := range []struct {
		name               string
		made, rows         map[string]uint64
		total, lost, extra uint64
	}{
		{"all found", map[string]uint64{a: 2, b: 1, c: 1}, map[string]uint64{a: 2, b: 1, c: 1}, 4, 0, 0},
		{"one lost", map[string]uint64{a: 2, b: 1}, map[string]uint64{a: 1, b: 1}, 2, 1, 0},
		{"one extra", map[string]uint64{a: 1}, map[string]uint64{a: 2}, 2, 0, 1},
		// Equal totals must not hide a lost row behind an extra one.
		{"lost and extra", map[string]uint64{a: 1, b: 1}, map[string]uint64{a: 2}, 2, 1, 1},
		{"wrong outcome", map[string]uint64{c: 1}, map[string]uint64{auditKey("02:be:00:00:00:02", []byte(`{"volume":3}`), "ok"): 1}, 1, 1, 1},
	} {
		total, lost, extra := matchAudit(tc.made, tc.rows)
		if total != tc.total || lost != tc.lost || extra != tc.extra {
			t.Errorf("%s: total %d lost %d extra %d, want %d %d %d", tc.name, total, lost, extra, tc.total, tc.lost, tc.extra)
		}
	}
	if auditKey("d", []byte(`{"volume": 3}`), "ok") != auditKey("d", []byte(`{"volume":3}`), "ok") {
		t.Error("auditKey depends on whitespace in the arguments")
	}
}

func TestFlatnessAndErr(t *testing.T) {
	samples := func(heaps ...uint64) []SoakSample {
		var ss []SoakSample
		for i, h := range heaps {
			ss = append(ss, SoakSample{ElapsedS: float64(i), RSS: 30 << 20, Heap: h << 20})
		}
		return ss
	}
	okAudit := SoakAudit{Available: true, OK: true, Verdict: "ok"}
	flat := &SoakReport{Memory: flatness(samples(10, 11, 10, 10, 11, 10, 11, 10, 10)), Audit: okAudit}
	if !flat.Memory.Flat || flat.Err() != nil {
		t.Errorf("flat heap: %+v, Err %v", flat.Memory, flat.Err())
	}
	growing := &SoakReport{Memory: flatness(samples(10, 10, 10, 12, 12, 12, 14, 14, 14)), Audit: okAudit}
	if growing.Memory.Flat || growing.Err() == nil || !strings.Contains(growing.Err().Error(), "GROWING") {
		t.Errorf("growing heap: %+v, Err %v", growing.Memory, growing.Err())
	}
	few := &SoakReport{Memory: flatness(samples(10, 20)), Audit: okAudit}
	if few.Err() != nil {
		t.Errorf("two samples cannot be judged, yet Err = %v", few.Err())
	}
	lost := &SoakReport{Memory: flat.Memory, Audit: SoakAudit{Available: true, Lost: 1, Verdict: "MISMATCH: 1 lost"}}
	if err := lost.Err(); err == nil || !strings.Contains(err.Error(), "MISMATCH") {
		t.Errorf("lost audit row: Err %v", err)
	}
}
