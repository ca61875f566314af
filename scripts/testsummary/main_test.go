package main

import (
	"os"
	"strings"
	"testing"
)

// summarize runs the summary over testdata/run.json (see testdata/README)
// with extra lines before it, and returns the console and the log.
func summarize(t *testing.T, before string) (s *summary, console, log string) {
	t.Helper()
	run, err := os.ReadFile("testdata/run.json")
	if err != nil {
		t.Fatal(err)
	}
	var c, l strings.Builder
	s = newSummary(&c, &l)
	if err := s.read(strings.NewReader(before + string(run))); err != nil {
		t.Fatal(err)
	}
	return s, c.String(), l.String()
}

// block returns the console text from the first line with start to the
// first line after it with end, both included.
func block(t *testing.T, console, start, end string) string {
	t.Helper()
	i := strings.Index(console, start)
	if i < 0 {
		t.Fatalf("console lacks %q:\n%s", start, console)
	}
	j := strings.Index(console[i:], end)
	if j < 0 {
		t.Fatalf("console lacks %q after %q:\n%s", end, start, console)
	}
	return console[i : i+j+len(end)]
}

func TestFailedTestsPrintedWhole(t *testing.T) {
	s, console, _ := summarize(t, "")
	// A parallel test's multi-line error, while another test wrote in
	// between: all its lines, in one piece, none of the other's.
	one := block(t, console, "=== RUN   TestOne\n", "--- FAIL: TestOne")
	want := "    a_test.go:8: first line\n        second line\n        \tthird indented\n--- FAIL: TestOne"
	if !strings.HasSuffix(one, want) || strings.Contains(one, "TestTwo") {
		t.Errorf("TestOne's block:\n%s\nwant it to end with:\n%s", one, want)
	}
	// A failed subtest with its parent, not the passing sibling.
	sub := block(t, console, "=== RUN   TestSub\n", "--- FAIL: TestSub ")
	if !strings.Contains(sub, "    a_test.go:17: sub broke\n          detail\n--- FAIL: TestSub/bad") || strings.Contains(sub, "TestSub/ok") {
		t.Errorf("TestSub's block:\n%s", sub)
	}
	for _, want := range []string{
		"b/b_test.go:5:28: undefined: undefined\n", // build failure
		"FAIL\texample.com/tj/b [build failed]\n",
		"panic: assignment to entry in nil map", // a panicking test
		"c_test.go:6",
		"    c_test.go:5: slow starting\n", // running when the package panicked
		"    d_test.go:5: about to hang\npanic: test timed out after 3s\n",
		"WARNING: DATA RACE\n",
		"e/e_test.go:9",
		"FAIL\texample.com/tj/a\t",
		"ok  \texample.com/tj/f\t",
	} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q", want)
		}
	}
	for _, noise := range []string{"two says hi", "a_test.go:16: fine", "noise that a passing run hides", "TestSkip", "=== NAME"} {
		if strings.Contains(console, noise) {
			t.Errorf("console shows %q from a test that did not fail", noise)
		}
	}
	// Each package's failures come with its result line, not mixed with
	// another's: packages run at once.
	if a := block(t, console, "=== RUN   TestSub\n", "FAIL\texample.com/tj/a\t"); !strings.Contains(a, "--- FAIL: TestOne") || strings.Contains(a, "tj/c") {
		t.Errorf("package a's part of the console:\n%s", a)
	}
	if s.passed != 3 || s.failed != 6 || s.skipped != 1 {
		t.Errorf("counts %d passed, %d failed, %d skipped; want 3, 6, 1", s.passed, s.failed, s.skipped)
	}
}

func TestLogHasEverything(t *testing.T) {
	_, console, log := summarize(t, "go: downloading example.com/x v1.0.0\n")
	for _, want := range []string{
		"go: downloading example.com/x v1.0.0\n",
		"# example.com/tj/b [example.com/tj/b.test]\n",
		"    a_test.go:12: two says hi\n        and more\n--- PASS: TestTwo",
		// Output resuming after another test's is named, as `go test -v` does.
		"--- PASS: TestTwo (0.02s)\n=== NAME  TestOne\n    a_test.go:8: first line\n",
		"    f_test.go:5: noise that a passing run hides\n        second noise line\n",
		"--- SKIP: TestSkip",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	// What is not an event is about the run: shown at once.
	if !strings.HasPrefix(console, "go: downloading example.com/x v1.0.0\n") {
		t.Errorf("console does not start with the go command's own line:\n%s", console)
	}
}

// TestStoppedRun: when the go command stops before a package ends, its
// failures so far still show, and its output is in the log.
func TestStoppedRun(t *testing.T) {
	run, err := os.ReadFile("testdata/run.json")
	if err != nil {
		t.Fatal(err)
	}
	end := strings.Index(string(run), `"Action":"fail","Package":"example.com/tj/a","Elapsed"`)
	if end < 0 {
		t.Fatal("testdata/run.json: package a does not end")
	}
	end = strings.LastIndex(string(run[:end]), "\n") + 1
	var c, l strings.Builder
	if err := newSummary(&c, &l).read(strings.NewReader(string(run[:end]))); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(c.String(), "        second line\n") || !strings.Contains(l.String(), "two says hi") {
		t.Errorf("console:\n%s\nlog:\n%s", c.String(), l.String())
	}
}
