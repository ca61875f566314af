package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// TestPostgresConnectTimeout: a PostgreSQL URL without connect_timeout
// gets store.DefaultConnectTimeout (pgx has none), one with it keeps its
// own, 0 included (no limit).
func TestPostgresConnectTimeout(t *testing.T) {
	for dsn, want := range map[string]time.Duration{
		"postgres://u@db:5432/x":                   store.DefaultConnectTimeout,
		"postgres://u@db:5432/x?connect_timeout=2": 2 * time.Second,
		"postgres://u@db:5432/x?connect_timeout=0": 0,
	} {
		if got := store.ConnectTimeout(dsn); got != want {
			t.Errorf("%s: connect timeout %s, want %s", dsn, got, want)
		}
	}
}

// TestPostgresSilentServer: opening a PostgreSQL store on a server that
// accepts connections and answers nothing (frozen, SIGSTOP) fails within
// the connect timeout instead of hanging.
func TestPostgresSilentServer(t *testing.T) {
	addr := storetest.SilentServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start := time.Now()
	s, err := store.Open(ctx, "postgres://u@"+addr+"/x?sslmode=disable&connect_timeout=1", t.TempDir())
	took := time.Since(start)
	if err == nil {
		s.Close()
		t.Fatal("opened a store on a server that answers nothing")
	}
	if ctx.Err() != nil || took > 10*time.Second {
		t.Fatalf("open failed after %s, want within about the 1 s connect_timeout: %v", took, err)
	}
	if !strings.Contains(err.Error(), "did not answer") {
		t.Errorf("error %q does not say the server did not answer", err)
	}
}

// TestFailureLog: a task failing again and again is logged once a
// minute, with how many failures were left out, and once when it succeeds
// again.
func TestFailureLog(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var l store.FailureLog
	l.OK(log, "write", "written again") // never failed: nothing to say
	for range 3 {
		l.Failed(log, slog.LevelWarn, "write", errors.New("down"))
	}
	l.Failed(log, slog.LevelError, "read", errors.New("down")) // each task on its own
	l.OK(log, "write", "written again")
	l.Failed(log, slog.LevelWarn, "write", errors.New("down again"))
	got := buf.String()
	for sub, want := range map[string]int{`msg=write error=down`: 1, `msg=read`: 1, `msg="written again"`: 1, `error="down again"`: 1} {
		if n := strings.Count(got, sub); n != want {
			t.Errorf("%q logged %d times, want %d:\n%s", sub, n, want, got)
		}
	}
}

// TestFailureLogDamaged: a failure on a damaged SQLite file, which no retry
// mends, is logged at ERROR whatever level the task asked.
func TestFailureLogDamaged(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var l store.FailureLog
	l.Failed(log, slog.LevelWarn, "write", fmt.Errorf("store: append audit: %w", store.ErrMalformed))
	if got := buf.String(); !strings.Contains(got, "level=ERROR msg=write") {
		t.Errorf("a damaged store's failure logged as %s, want level=ERROR", got)
	}
}
