package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

func TestClusterConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no store", Config{Cluster: 3}, "--cluster needs --store postgres://"},
		{"sqlite", Config{Cluster: 3, Store: "sqlite:/tmp/x.db"}, "refuses SQLite"},
		{"one node", Config{Cluster: 1, Store: "postgres://h/db"}, "at least 2 nodes"},
		{"storm alone", Config{Storm: 100}, "run on a cluster"},
		{"loads alone", Config{ClusterLoads: []int{4}}, "run on a cluster"},
		{"node procs alone", Config{NodeProcs: 1}, "run on a cluster"},
		{"no workers", Config{Cluster: 2, Store: "postgres://h/db", ClusterLoads: []int{4, 0}}, "--cluster-loads 0"},
		{"with mqtt", Config{Cluster: 2, Store: "postgres://h/db", MQTT: true}, "excludes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := tc.cfg.normalize()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	if _, err := (Config{Cluster: 2, Store: "postgres://u:pw@h/db", Storm: 10}).normalize(); err != nil {
		t.Errorf("a cluster on PostgreSQL: %v", err)
	}
}

// Each node gets its share of the cores unless told otherwise.
func TestNodeProcs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flag, nodes, cpus int
		env               string
		want              int
	}{
		{0, 3, 2, "", 1},
		{0, 3, 16, "", 5},
		{0, 2, 8, "", 4},
		{0, 3, 16, "2", 0}, // the environment's, inherited
		{3, 3, 2, "1", 3},  // the flag wins
		{-1, 3, 2, "", 0},  // Go's default
	} {
		if got := nodeProcs(tc.flag, tc.nodes, tc.cpus, tc.env); got != tc.want {
			t.Errorf("nodeProcs(%d, %d nodes, %d cpus, GOMAXPROCS=%q) = %d, want %d", tc.flag, tc.nodes, tc.cpus, tc.env, got, tc.want)
		}
	}
	if env := procsEnv(0); env != nil {
		t.Errorf("procsEnv(0) = %q, want nothing", env)
	}
	if env := procsEnv(2); len(env) != 1 || env[0] != "GOMAXPROCS=2" {
		t.Errorf("procsEnv(2) = %q", env)
	}
}

// A child started with an environment gets it on top of this process's.
func TestStartProcessEnv(t *testing.T) {
	t.Parallel()
	out := &tailBuffer{max: 4 << 10}
	_, exited, stop, err := startProcess(t.Context(), "/bin/sh", []string{"-c", `echo "$GOMAXPROCS $HOME"`}, procsEnv(3), out, "sh", out)
	if err != nil {
		t.Fatal(err)
	}
	<-exited
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(out.String()), "3 "+os.Getenv("HOME"); got != want {
		t.Errorf("the child saw %q, want %q", got, want)
	}
}

// TestRunCluster runs the cluster phases and a small storm on two real
// `mcpgate serve` nodes and the test PostgreSQL: the figures are there and
// sane (not timed: this machine is shared).
func TestRunCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the mcpgate binary and starts two nodes")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	dsn := storetest.PostgresDSN(t)
	exe := filepath.Join(t.TempDir(), "mcpgate")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", exe, "github.com/mcpgate/mcpgate/cmd/mcpgate")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	pgStatLag = time.Second // the store figures may then miss the last writes: not checked here
	var gwlog bytes.Buffer
	const storm = 40
	rep, err := Run(context.Background(), Config{Executable: exe, Cluster: 2, Store: dsn, Devices: 10, Concurrency: 2,
		Duration: 500 * time.Millisecond, Warmup: 200 * time.Millisecond, Storm: storm, ClusterLoads: []int{1, 3}, NodeProcs: 1, GatewayLog: &gwlog})
	if err != nil {
		t.Fatalf("%v\nnodes' output:\n%s", err, &gwlog)
	}
	c := rep.Cluster
	if c == nil || len(c.Nodes) != 2 || c.Nodes[0].PID == 0 || c.Nodes[0].PID == c.Nodes[1].PID || c.Nodes[0].URL == c.Nodes[1].URL {
		t.Fatalf("nodes %+v", c)
	}
	if c.NodeProcs != 1 {
		t.Errorf("node procs %d, want 1 as asked", c.NodeProcs)
	}
	if strings.Contains(c.Store, "password") {
		t.Errorf("store %q", c.Store)
	}
	for name, ph := range map[string]*PhaseReport{"local": c.Local, "cross": c.Cross, "local serial": c.LocalSerial, "cross serial": c.CrossSerial} {
		if ph == nil || ph.Calls == 0 || ph.ErrorCount() != 0 || ph.Latency.P50MS <= 0 {
			t.Errorf("%s: %+v", name, ph)
			continue
		}
		if ph.CPU == nil || ph.CPU.GatewayPerCallUS <= 0 {
			t.Errorf("%s: no gateway CPU %+v", name, ph.CPU)
		}
	}
	if c.LocalSerial != nil && c.LocalSerial.Workers != 1 {
		t.Errorf("serial phase with %d workers", c.LocalSerial.Workers)
	}
	if len(c.Goals) != 2 || c.Goals[0].Status == "n/a" || c.Goals[1].Status == "n/a" {
		t.Errorf("goals %+v", c.Goals)
	}
	if len(c.Loads) != 2 || c.Loads[0].Workers != 1 || c.Loads[1].Workers != 3 {
		t.Errorf("loads %+v", c.Loads)
	}
	for _, l := range c.Loads {
		if l.Local == nil || l.Cross == nil || l.Local.Workers != l.Workers || l.Cross.Workers != l.Workers || l.Local.Calls == 0 || l.Cross.Calls == 0 ||
			l.Ratio <= 0 || l.Ratio != cpuRatio(l.Local, l.Cross) {
			t.Errorf("load of %d workers: %+v", l.Workers, l)
		}
	}
	if f := c.NATSFloor; f == nil || f.RoundTrips == 0 || f.Workers != 2 || f.Rate != c.Cross.CallsPerSec || f.Serial.Count == 0 || f.Serial.P50MS <= 0 {
		t.Errorf("NATS floor %+v", f)
	} else if a := f.Apart; a == nil || a.Serial.Count == 0 || a.Serial.P50MS <= 0 {
		t.Errorf("NATS floor apart %+v", a)
	}
	s := c.Storm
	if s == nil {
		t.Fatal("no storm")
	}
	if s.Devices != storm || s.ReadyS <= 0 || s.CallableS < s.ReadyS || s.Uncallable != 0 || s.Calls < storm {
		t.Errorf("storm %+v", s)
	}
	sum := func(v []int) (n int) {
		for _, x := range v {
			n += x
		}
		return n
	}
	if len(s.PerNodeBefore) != 2 || sum(s.PerNodeBefore) != storm || sum(s.PerNodeAfter) != storm || s.PerNodeAfter[0] == 0 || s.PerNodeAfter[1] == 0 {
		t.Errorf("storm spread: before %v, after %v", s.PerNodeBefore, s.PerNodeAfter)
	}
	if st := s.Store; st == nil || st.DeviceRows < 0 || st.Commits < 0 || st.WindowS <= 0 {
		t.Errorf("store figures %+v", st)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"cross-node, 1 at a time", "reconnect storm", "per reconnect", "cross-node gateway CPU per call", "NATS floor", "NATS alone takes", "direct (the caller a client", "apart (the answering server",
		"NATS alone between two processes takes",
		"the CPU ratio against load"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, &text)
		}
	}
	if t.Failed() {
		t.Logf("report:\n%s\nnodes' output:\n%s", &text, &gwlog)
	}
}

// TestNATSFloor runs the floor alone: paced round trips at the rate asked,
// their CPU less the pacing's, and latency one at a time.
func TestNATSFloor(t *testing.T) {
	// Not parallel: the floor's CPU is this whole process's, and the
	// parallel tests wait until the sequential ones are done.
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	// Enough round trips that their CPU spans many of /proc's 10 ms ticks.
	f, err := runNATSFloor(t.Context(), "", 2000, 4, time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Fewer if the machine is slow, never more than the schedule allows.
	if f.RoundTrips == 0 || f.RoundTrips > 2000+4 {
		t.Errorf("round trips %d, want 1..2004 at 2000/s for 1 s", f.RoundTrips)
	}
	if f.CPUPerRoundTripUS <= 0 || f.PacingUS < 0 || f.Serial.Count == 0 || f.Serial.P50MS <= 0 || f.Serial.P50MS > f.Serial.MaxMS {
		t.Errorf("floor %+v", f)
	}
	if d := f.Direct; d == nil || d.RoundTrips == 0 || d.RoundTrips > 2000+4 || d.CPUPerRoundTripUS <= 0 || d.Serial.Count == 0 || d.Serial.P50MS <= 0 {
		t.Errorf("direct floor %+v", d)
	}
	if f.Apart != nil {
		t.Errorf("apart measured without an executable: %+v", f.Apart)
	}
	if _, err := runNATSFloor(t.Context(), "", 0, 4, time.Millisecond, 0); err == nil {
		t.Error("a floor without a rate ran")
	}
	// An executable without the peer command: a clear error, not a hang.
	if _, err := floorApart(t.Context(), "/bin/true", time.Millisecond, make([]byte, floorMessageBytes), nil); err == nil || !strings.Contains(err.Error(), "exited without its address") {
		t.Errorf("apart with /bin/true: %v", err)
	}
}
