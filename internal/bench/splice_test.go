package bench

import (
	"bytes"
	"strings"
	"testing"
)

// TestRunSplice runs a short splice measurement end to end: frames go
// through the gateway and back, REST calls run meanwhile, the gateway's
// histogram is read.
func TestRunSplice(t *testing.T) {
	rep, err := RunSplice(t.Context(), SpliceConfig{Frames: 200, Calls: 1})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Direct.Count != 200 || rep.Spliced.Count != 200 {
		t.Errorf("timed %d direct and %d spliced frames, want 200 each", rep.Direct.Count, rep.Spliced.Count)
	}
	if rep.ToolCalls == 0 {
		t.Error("no REST call completed while frames were timed")
	}
	if rep.GatewayP99MS["to_upstream"] <= 0 || rep.GatewayP99MS["to_device"] <= 0 {
		t.Errorf("gateway histogram p99 %v", rep.GatewayP99MS)
	}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil || !strings.Contains(b.String(), "added per frame") {
		t.Errorf("report %q, %v", b.String(), err)
	}
}

// TestRunSpliceRefusesNegativeSizes: a negative number of frames or frame
// size is refused, not taken for the default.
func TestRunSpliceRefusesNegativeSizes(t *testing.T) {
	t.Parallel()
	for _, cfg := range []SpliceConfig{{Frames: -5}, {FrameBytes: -1}} {
		if _, err := RunSplice(t.Context(), cfg); err == nil || !strings.Contains(err.Error(), "want positive numbers") {
			t.Errorf("%+v: err = %v, want a refusal", cfg, err)
		}
	}
}
