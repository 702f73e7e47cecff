package main

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/txevidence/otelpgxtx/scripts/pgxsuite/probe"
)

// statuses makes results from a map of test statuses.
func statuses(m map[string]string) *results { return &results{status: m} }

func TestRegressions(t *testing.T) {
	base := statuses(map[string]string{
		"TestSame": pass, "TestFails": pass, "TestFails/sub": pass, "TestFails/other": pass,
		"TestGone": pass, "TestSkipped": pass, "TestBaselineFails": fail, "TestBaselineSkips": skip,
	})
	inst := statuses(map[string]string{
		"TestSame": pass, "TestFails": fail, "TestFails/sub": fail, "TestFails/other": pass,
		"TestSkipped": skip, "TestBaselineFails": fail, "TestBaselineSkips": fail,
	})
	// TestFails is left out: it fails because its subtest does. TestGone never ran.
	want := []string{"TestFails/sub", "TestGone", "TestSkipped"}
	if got := regressions(base, inst); !reflect.DeepEqual(got, want) {
		t.Errorf("regressions = %q, want %q", got, want)
	}
	if got := regressions(base, base); got != nil {
		t.Errorf("a run compared with itself: regressions %q", got)
	}
}

func TestConfirmed(t *testing.T) {
	reg := []string{"TestA/sub", "TestFlaky", "TestBaselineBroken"}
	baseAlone := map[string]*results{
		"TestA":              statuses(map[string]string{"TestA": pass, "TestA/sub": pass}),
		"TestFlaky":          statuses(map[string]string{"TestFlaky": pass}),
		"TestBaselineBroken": statuses(map[string]string{"TestBaselineBroken": fail}),
	}
	instAlone := map[string]*results{
		"TestA":              statuses(map[string]string{"TestA": fail, "TestA/sub": fail}),
		"TestFlaky":          statuses(map[string]string{"TestFlaky": pass}),
		"TestBaselineBroken": statuses(map[string]string{"TestBaselineBroken": fail}),
	}
	yes, no := confirmed(reg, baseAlone, instAlone)
	if !reflect.DeepEqual(yes, []string{"TestA/sub"}) || !reflect.DeepEqual(no, []string{"TestFlaky", "TestBaselineBroken"}) {
		t.Errorf("confirmed = %q, not confirmed = %q", yes, no)
	}
	if got := tops(reg); !reflect.DeepEqual(got, []string{"TestA", "TestBaselineBroken", "TestFlaky"}) {
		t.Errorf("tops = %q", got)
	}
}

func TestUnexpected(t *testing.T) {
	list := []expected{
		{mode: probe.Connect, pkg: "pgx", test: "TestKnown"},
		{mode: probe.Connect, pkg: "pgx", test: "TestFixed"},
		{mode: probe.Parse, pkg: "pgx", test: "TestOther"},
	}
	rest, hit, stale := unexpected(list, "pgx", probe.Connect, []string{"TestKnown", "TestNew", "TestOther"})
	if !reflect.DeepEqual(rest, []string{"TestNew", "TestOther"}) {
		t.Errorf("rest = %q", rest)
	}
	if len(hit) != 1 || hit[0].test != "TestKnown" || len(stale) != 1 || stale[0].test != "TestFixed" {
		t.Errorf("hit = %v, stale = %v", hit, stale)
	}
}

func TestReportProblems(t *testing.T) {
	clean := &probe.Report{Mode: probe.Parse, FramesStarted: 3, FramesEnded: 3}
	if got := reportProblems(clean, nil, true); got != nil {
		t.Errorf("a clean report: %q", got)
	}
	for name, c := range map[string]struct {
		rep     *probe.Report
		missing error
		want    string
	}{
		"no report":     {nil, errors.New("no such file"), "no probe report"},
		"no frame":      {&probe.Report{}, nil, "no frame span at all"},
		"handler":       {&probe.Report{FramesStarted: 1, HandlerErrors: []probe.Call{{Test: "TestX", Error: "boom"}}}, nil, "error handler was called in TestX: boom"},
		"instrument":    {&probe.Report{FramesStarted: 1, InstrumentErrors: []probe.Call{{Error: "twice"}}}, nil, "outside any test's goroutine"},
		"no outcome":    {&probe.Report{FramesStarted: 1, NoOutcome: []probe.Frame{{Test: "TestY"}}}, nil, "without tx.outcome in TestY"},
		"unended":       {&probe.Report{FramesStarted: 1, Unended: []probe.Frame{{Test: "TestZ"}}}, nil, "never ended though its connection closed in TestZ"},
		"unended, busy": {&probe.Report{FramesStarted: 1, Busy: 2, Unended: []probe.Frame{{}}}, nil, "2 connections still running a query"},
		"metrics":       {&probe.Report{FramesStarted: 1, MetricsError: "bad"}, nil, "collecting the metrics failed: bad"},
	} {
		got := reportProblems(c.rep, c.missing, true)
		if len(got) != 1 || !strings.Contains(got[0], c.want) {
			t.Errorf("%s: problems %q, want one saying %q", name, got, c.want)
		}
	}
}

func TestTally(t *testing.T) {
	got := tally([]string{"b", "a", "b", "b"})
	if want := []string{"(3 times) b", "a"}; !reflect.DeepEqual(got, want) {
		t.Errorf("tally = %q, want %q", got, want)
	}
	if got := reportProblems(&probe.Report{}, nil, false); got != nil {
		t.Errorf("a run of some tests only, none of which made a frame: %q", got)
	}
}
