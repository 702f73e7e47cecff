package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// The statuses of a test in a run. notRun is a test the run never finished: the binary
// ended (a panic, a timeout) while it ran or before it started.
const (
	pass   = "pass"
	fail   = "fail"
	skip   = "skip"
	notRun = "not run"
)

// event is one line of `go tool test2json` output.
type event struct {
	Action  string
	Test    string
	Elapsed float64
	Output  string
}

// results is what one run of one package's test binary said about its tests.
type results struct {
	// status of every test and subtest by its full name ("TestTx/commit"); a test that
	// started and never ended is notRun.
	status map[string]string
	// output of each test (the package's own under ""), for failure messages.
	output map[string]*strings.Builder
	// panics are the lines that start a panic, a fatal runtime error or a data race
	// report, with the test they were printed under.
	panics []string
	// ended is whether the binary reported the package's result; passed is that result.
	ended, passed bool
	// elapsed is the package's time as the binary reported it, in seconds.
	elapsed float64
}

// parseEvents reads test2json output.
func parseEvents(r io.Reader) (*results, error) {
	res := &results{status: map[string]string{}, output: map[string]*strings.Builder{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil {
			return nil, fmt.Errorf("pgxsuite: test2json output %q: %w", line, err)
		}
		res.add(ev)
	}
	return res, sc.Err()
}

func (res *results) add(ev event) {
	switch ev.Action {
	case "run":
		res.status[ev.Test] = notRun
	case pass, fail, skip:
		if ev.Test == "" {
			res.ended, res.passed, res.elapsed = true, ev.Action == pass, ev.Elapsed
			return
		}
		res.status[ev.Test] = ev.Action
	case "output":
		b := res.output[ev.Test]
		if b == nil {
			b = &strings.Builder{}
			res.output[ev.Test] = b
		}
		b.WriteString(ev.Output)
		if isPanic(ev.Output) {
			where := ev.Test
			if where == "" {
				where = "(package)"
			}
			res.panics = append(res.panics, where+": "+strings.TrimSpace(ev.Output))
		}
	}
}

// isPanic reports whether a line of output starts a panic, a fatal runtime error (a
// concurrent map write, a select on a synctest channel from outside its bubble) or the
// race detector's report, which fails a test only when it runs inside one.
func isPanic(line string) bool {
	return strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") ||
		strings.HasPrefix(line, "WARNING: DATA RACE")
}

// counts returns how many tests (subtests included) passed, failed, were skipped and
// were not run.
func (res *results) counts() (passed, failed, skipped, unrun int) {
	for _, s := range res.status {
		switch s {
		case pass:
			passed++
		case fail:
			failed++
		case skip:
			skipped++
		default:
			unrun++
		}
	}
	return
}

// with returns the names of the tests whose status is s, sorted.
func (res *results) with(s string) []string {
	var names []string
	for name, st := range res.status {
		if st == s {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// get is the status of test name; notRun when the run never started it.
func (res *results) get(name string) string {
	if s, ok := res.status[name]; ok {
		return s
	}
	return notRun
}

// tail returns the last n lines of a test's output.
func (res *results) tail(name string, n int) string {
	b := res.output[name]
	if b == nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// topLevel is the top-level test of a (sub)test name.
func topLevel(name string) string {
	top, _, _ := strings.Cut(name, "/")
	return top
}
