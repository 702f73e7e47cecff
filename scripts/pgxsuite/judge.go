package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/txevidence/otelpgxtx/scripts/pgxsuite/probe"
)

// regressions returns the tests that passed in the baseline and did not pass with the
// library (failed, were skipped, or never ran because the binary ended), leaves only: a
// test whose subtest is listed failed because of it.
func regressions(base, inst *results) []string {
	var names []string
	for _, name := range base.with(pass) {
		if inst.get(name) != pass {
			names = append(names, name)
		}
	}
	var leaves []string
	for i, name := range names {
		// names is sorted, so a test's subtests follow it.
		if i+1 < len(names) && strings.HasPrefix(names[i+1], name+"/") {
			continue
		}
		leaves = append(leaves, name)
	}
	return leaves
}

// confirmed splits the regressions of a full run by what their top-level tests did when
// rerun alone: confirmed are those that passed alone in the baseline and did not pass
// alone with the library; the others did not fail again.
func confirmed(names []string, baseAlone, instAlone map[string]*results) (yes, no []string) {
	for _, name := range names {
		b, i := baseAlone[topLevel(name)], instAlone[topLevel(name)]
		if b != nil && i != nil && b.get(name) == pass && i.get(name) != pass {
			yes = append(yes, name)
		} else {
			no = append(no, name)
		}
	}
	return yes, no
}

// tops returns the distinct top-level tests of names, sorted.
func tops(names []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range names {
		if t := topLevel(n); !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out
}

// reportProblems lists what the probe's report of an instrumented run shows wrong; missing
// is why there is no report. wantFrames is whether the run ran tests that make frames
// (all of them, not those of a -run pattern).
func reportProblems(rep *probe.Report, missing error, wantFrames bool) []string {
	if rep == nil {
		return []string{fmt.Sprintf("no probe report (%v): the test binary ended before its TestMain finished (a panic, a timeout, os.Exit)", missing)}
	}
	var out []string
	for _, c := range rep.HandlerErrors {
		out = append(out, fmt.Sprintf("the OpenTelemetry error handler was called%s: %s", in(c.Test), c.Error))
	}
	for _, c := range rep.InstrumentErrors {
		out = append(out, fmt.Sprintf("instrumenting a configuration failed%s: %s", in(c.Test), c.Error))
	}
	for _, f := range rep.NoOutcome {
		out = append(out, fmt.Sprintf("a frame span ended without tx.outcome%s: %v", in(f.Test), f.Attributes))
	}
	for _, f := range rep.Unended {
		msg := fmt.Sprintf("a frame span never ended though its connection closed%s", in(f.Test))
		if rep.Busy > 0 {
			msg += fmt.Sprintf(" (or it is on one of the %d connections still running a query at the end)", rep.Busy)
		}
		out = append(out, msg)
	}
	if rep.MetricsError != "" {
		out = append(out, "collecting the metrics failed: "+rep.MetricsError)
	}
	if wantFrames && rep.FramesStarted == 0 {
		out = append(out, "no frame span at all: the library was not installed")
	}
	sort.Strings(out)
	return out
}

// in names the test a problem happened in, if known.
func in(test string) string {
	if test == "" {
		return " (outside any test's goroutine)"
	}
	return " in " + test
}

// expected is a test that fails in one mode because of how that mode installs the
// library, not because of anything the library does; why says how.
type expected struct {
	mode, pkg, test, why string
}

// byConstruction are the expected failures. Each must still fail (see unexpected), so
// that the list cannot outlive its reason.
var byConstruction = []expected{
	{
		mode: probe.Connect, pkg: "pgx", test: "TestConnect",
		why: "it asserts that Conn.Config() returns the configuration it gave ConnectConfig, Tracer included; " +
			"the connect mode instruments the connection's own copy inside pgx, which no application can do " +
			"(in the parse mode, the way an application installs the library, the test passes)",
	},
}

// unexpected removes from reg, the regressions of pkg in mode, the expected failures, and
// returns those it removed and the entries of list for pkg and mode that did not fail.
func unexpected(list []expected, pkg, mode string, reg []string) (rest []string, hit, stale []expected) {
	failed := map[string]bool{}
	for _, name := range reg {
		failed[name] = true
	}
	mine := map[string]bool{}
	for _, e := range list {
		if e.pkg != pkg || e.mode != mode {
			continue
		}
		mine[e.test] = true
		if failed[e.test] {
			hit = append(hit, e)
		} else {
			stale = append(stale, e)
		}
	}
	for _, name := range reg {
		if !mine[name] {
			rest = append(rest, name)
		}
	}
	return rest, hit, stale
}

// tally gives each distinct problem once, in the order first seen, with how many times
// it was seen when more than once.
func tally(problems []string) []string {
	n := map[string]int{}
	var order []string
	for _, p := range problems {
		if n[p] == 0 {
			order = append(order, p)
		}
		n[p]++
	}
	out := make([]string, len(order))
	for i, p := range order {
		out[i] = p
		if n[p] > 1 {
			out[i] = fmt.Sprintf("(%d times) %s", n[p], p)
		}
	}
	return out
}
