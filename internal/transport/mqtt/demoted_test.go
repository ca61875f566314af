package mqtt

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// The broker's Info records reach the log only at Debug; its warnings stay.
func TestBrokerInfoDemoted(t *testing.T) {
	for _, tc := range []struct {
		level    slog.Level
		wantInfo string // "" when the Info record must not be written
	}{
		{slog.LevelInfo, ""},
		{slog.LevelDebug, "level=DEBUG msg=\"attached listener\" component=mqtt_broker"},
	} {
		var b bytes.Buffer
		log := slog.New(demoted{slog.NewTextHandler(&b, &slog.HandlerOptions{Level: tc.level})}).With("component", "mqtt_broker")
		log.Info("attached listener")
		log.Warn("client error")
		out := b.String()
		if tc.wantInfo == "" && strings.Contains(out, "attached listener") || tc.wantInfo != "" && !strings.Contains(out, tc.wantInfo) {
			t.Errorf("at %v: %q, want Info record %q", tc.level, out, tc.wantInfo)
		}
		if !strings.Contains(out, `level=WARN msg="client error" component=mqtt_broker`) {
			t.Errorf("at %v: %q, want the warning as is", tc.level, out)
		}
	}
}
