// Command testsummary reads `go test -json` events on stdin and keeps the
// console short without losing a failure: it prints each package's result
// line, and the whole output of every failed test (from "=== RUN" to
// "--- FAIL", every continuation line, its failed subtests', a race report
// or panic in it) when it fails. A failed package also shows its own output
// (build errors, a panic or timeout outside any finished test, TestMain's
// complaints) and the output of tests it left unfinished.
//
// The full output, as `go test -v` would print it, goes to the -log file.
// The counts of passed, failed and skipped tests and subtests go to the
// -counts file as three numbers. scripts/test.sh runs it:
//
//	go test -json ./... 2>&1 | testsummary -log test.log -counts counts
//
// Text with time-ordered interleaving is what `go test -v` gives; its
// parallel tests' lines cannot be told apart there, hence the events.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
)

func main() {
	logPath := flag.String("log", "", "file to write the full test output to")
	countsPath := flag.String("counts", "", `file to write "PASSED FAILED SKIPPED" to`)
	flag.Parse()
	if *logPath == "" || *countsPath == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: go test -json ./... 2>&1 | testsummary -log FILE -counts FILE")
		os.Exit(2)
	}
	logf, err := os.Create(*logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(1)
	}
	s := newSummary(os.Stdout, logf)
	if err := s.read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(1)
	}
	if err := errors.Join(s.logErr, logf.Close()); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(1)
	}
	counts := fmt.Sprintf("%d %d %d\n", s.passed, s.failed, s.skipped)
	if err := os.WriteFile(*countsPath, []byte(counts), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json), including the
// build events of Go 1.24 and later.
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	ImportPath  string // build-output and build-fail
	FailedBuild string // a package's fail: the ImportPath whose build failed
}

// line is one output line, numbered in arrival order so that a test's and
// its subtests' lines print in the order they were written.
type line struct {
	seq  int
	text string
}

type test struct {
	lines []line
	done  bool // passed, failed or skipped
	fail  bool
}

type pkg struct {
	own   []line           // output outside any test
	tests map[string]*test // by full name, subtests included; dropped once a top-level test passes
	// log is the package's output for the log, written there in one piece
	// when it ends, as `go test -v` does: packages run at once.
	log strings.Builder
	// lastTest is the test whose output log shows last.
	lastTest string
	// failures holds the output of its failed tests, each test's in one
	// piece, printed when the package ends: packages run at once.
	failures []line
	// raced holds the lines of passed tests that printed a race report:
	// the report names the test that was running, which need not be the
	// one that fails for it.
	raced []line
}

// summary is the reader's state; it is used by one goroutine.
type summary struct {
	console io.Writer
	log     io.Writer
	logErr  error // the first failed write to log
	seq     int
	pkgs    map[string]*pkg
	builds  map[string][]string // build output by ImportPath
	passed  int
	failed  int
	skipped int
}

func newSummary(console, log io.Writer) *summary {
	return &summary{console: console, log: log, pkgs: map[string]*pkg{}, builds: map[string][]string{}}
}

func (s *summary) read(r io.Reader) error {
	br := bufio.NewReader(r)
	for {
		text, err := br.ReadString('\n')
		if text != "" {
			s.handle(text)
		}
		if err == io.EOF {
			// Packages that never ended (the go command was stopped):
			// their output so far.
			for _, name := range slices.Sorted(maps.Keys(s.pkgs)) {
				s.write(s.log, s.pkgs[name].log.String())
				s.packageFailed(s.pkgs[name])
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
	}
}

// handle takes one input line: an event, or anything else the go command
// printed (shown at once: it is rare and is about the run itself).
func (s *summary) handle(text string) {
	var e event
	if !strings.HasPrefix(text, "{") || json.Unmarshal([]byte(text), &e) != nil || e.Action == "" {
		s.write(s.log, text)
		s.write(s.console, text)
		return
	}
	switch e.Action {
	case "build-output":
		s.write(s.log, e.Output)
		s.builds[e.ImportPath] = append(s.builds[e.ImportPath], e.Output)
		return
	case "build-fail":
		for _, t := range s.builds[e.ImportPath] {
			s.write(s.console, t)
		}
		delete(s.builds, e.ImportPath)
		return
	}
	if e.Package == "" {
		return
	}
	p := s.pkgs[e.Package]
	if p == nil {
		p = &pkg{tests: map[string]*test{}}
		s.pkgs[e.Package] = p
	}
	switch e.Action {
	case "output":
		// As `go test -v` does, name the test whose output resumes after
		// another's: parallel tests interleave.
		if e.Test != "" && e.Test != p.lastTest && !strings.HasPrefix(e.Output, "=== ") && !strings.HasPrefix(e.Output, "--- ") {
			p.log.WriteString("=== NAME  " + e.Test + "\n")
		}
		p.lastTest = e.Test
		p.log.WriteString(e.Output)
		s.seq++
		l := line{s.seq, e.Output}
		if e.Test == "" {
			p.own = append(p.own, l)
			return
		}
		t := p.test(e.Test)
		t.lines = append(t.lines, l)
	case "pass", "skip", "fail":
		if e.Test == "" {
			s.write(s.log, p.log.String())
			if e.Action == "fail" {
				s.packageFailed(p)
			} else {
				for _, l := range p.own { // its result line
					if strings.HasPrefix(l.text, "ok ") {
						s.write(s.console, l.text)
					}
				}
			}
			delete(s.pkgs, e.Package)
			return
		}
		t := p.test(e.Test)
		t.done, t.fail = true, e.Action == "fail"
		switch e.Action {
		case "pass":
			s.passed++
		case "skip":
			s.skipped++
		case "fail":
			s.failed++
		}
		if strings.Contains(e.Test, "/") {
			return // printed or dropped with its top-level test
		}
		if t.fail {
			p.failures = append(p.failures, sorted(p.failedLines(e.Test))...)
		} else if lines := p.allLines(e.Test); hasRace(lines) {
			p.raced = append(p.raced, lines...)
		}
		p.drop(e.Test)
	}
}

// packageFailed prints a failed package's failed tests, each in one
// piece, then what else it printed: its own output (a build failure, a
// panic outside a test, TestMain's complaints, its FAIL line), tests it
// left unfinished (running when it panicked or timed out), and race reports
// printed in tests that passed.
func (s *summary) packageFailed(p *pkg) {
	s.writeLines(s.console, p.failures)
	var rest []line
	rest = append(rest, p.own...)
	rest = append(rest, p.raced...)
	for _, t := range p.tests { // finished top-level tests are dropped already
		if t.shown() {
			rest = append(rest, t.lines...)
		}
	}
	s.writeLines(s.console, sorted(rest))
}

func (p *pkg) test(name string) *test {
	t := p.tests[name]
	if t == nil {
		t = &test{}
		p.tests[name] = t
	}
	return t
}

// shown says whether a test's output belongs with a failure: it failed,
// did not finish, or printed a race report.
func (t *test) shown() bool {
	return t.fail || !t.done || hasRace(t.lines)
}

// failedLines is the output of the top-level test name and of its subtests
// that are shown, in the order written.
func (p *pkg) failedLines(name string) []line {
	var lines []line
	for n, t := range p.tests {
		if n == name || strings.HasPrefix(n, name+"/") && t.shown() {
			lines = append(lines, t.lines...)
		}
	}
	return lines
}

// allLines is the output of the top-level test name and all its subtests.
func (p *pkg) allLines(name string) []line {
	var lines []line
	for n, t := range p.tests {
		if n == name || strings.HasPrefix(n, name+"/") {
			lines = append(lines, t.lines...)
		}
	}
	return lines
}

// drop forgets a finished top-level test and its subtests.
func (p *pkg) drop(name string) {
	for n := range p.tests {
		if n == name || strings.HasPrefix(n, name+"/") {
			delete(p.tests, n)
		}
	}
}

func hasRace(lines []line) bool {
	return slices.ContainsFunc(lines, func(l line) bool { return strings.Contains(l.text, "WARNING: DATA RACE") })
}

// sorted sorts lines in the order they were written.
func sorted(lines []line) []line {
	slices.SortFunc(lines, func(a, b line) int { return a.seq - b.seq })
	return lines
}

func (s *summary) writeLines(w io.Writer, lines []line) {
	for _, l := range lines {
		s.write(w, l.text)
	}
}

// write keeps the log's first error for main to report, and ignores the
// console's: a closed console must not stop the log.
func (s *summary) write(w io.Writer, text string) {
	if _, err := io.WriteString(w, text); err != nil && w == s.log && s.logErr == nil {
		s.logErr = fmt.Errorf("write the log: %w", err)
	}
}
