package main

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.yaml.in/yaml/v3"

	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// jaegerModuleVersion is the Go module version of Jaeger v2 that scripts/jaeger builds
// (v1.76.0 is Jaeger v2.13.0).
const jaegerModuleVersion = "v1.76.0"

// TestJaegerRoundTrip runs the demo's scenarios against a real Jaeger v2 (the binary
// scripts/jaeger builds), over OTLP/HTTP and OTLP/gRPC, and reads every trace back
// through Jaeger's query APIs: the spans must arrive intact, with the outcome, status,
// phase events and parent/child structure the span contract promises, and the search by
// tag tx.outcome=indeterminate must find exactly the indeterminate frames.
//
// The demo runs with the library's default (transaction-control statements and implicit
// prepares as events) over both protocols, and with their spans (-spans spans) over
// OTLP/HTTP.
func TestJaegerRoundTrip(t *testing.T) {
	j := startJaeger(t)
	for _, run := range []struct{ proto, spans string }{{protoHTTP, spansEvents}, {protoGRPC, spansEvents}, {protoHTTP, spansStatements}} {
		proto := run.proto
		t.Run(strings.ReplaceAll(proto, "/", "_")+"/"+run.spans, func(t *testing.T) {
			ctx := pgtest.Context(t, 3*time.Minute)
			endpoint := "http://" + j.otlpHTTP
			if proto == protoGRPC {
				endpoint = "http://" + j.otlpGRPC
			}
			service := "otelpgxtx-e2e-" + strings.ReplaceAll(proto, "/", "-") + "-" + run.spans
			var out, errOut syncBuffer
			cfg := config{
				databaseURL:     srv.ConnString(), // as docker compose passes DATABASE_URL
				otlpEndpoint:    endpoint,
				otlpProtocol:    proto,
				otlpWait:        10 * time.Second,
				serviceName:     service,
				tree:            treeNever,
				spans:           run.spans,
				jaegerUI:        "http://" + j.query,
				scenarioTimeout: time.Minute,
			}
			searchFrom := time.Now().Add(-time.Minute)
			a, err := newApp(ctx, cfg, &out, &errOut)
			if err != nil {
				t.Fatal(err)
			}
			rep := a.round(ctx, 1)
			if proto == protoHTTP && run.spans == spansEvents {
				checkAlertRulesAgainstMetrics(t, a)
			}
			a.report(rep)
			if err := a.close(ctx); err != nil { // flushes the batch span processor
				t.Fatal(err)
			}
			t.Logf("demo output:\n%s\n%s", out.String(), errOut.String())
			if !rep.ok() {
				t.Fatal("the demo's own checks failed (see its output above)")
			}
			if !strings.Contains(out.String(), "Traces were exported to "+endpoint) {
				t.Fatal("the demo did not export over OTLP")
			}

			// Read every scenario's trace back, waiting until all its spans are in.
			byName := map[string]*jTrace{}
			for _, sr := range rep.scenarios {
				jt := j.waitForTrace(t, ctx, sr.traceID.String(), len(sr.spans))
				sameSpans(t, sr.sc.name, sr.spans, jt)
				byName[sr.sc.name] = jt
			}
			checkScenarios(t, byName, run.spans == spansEvents)
			checkIndeterminateLog(t, errOut.String(), byName["indeterminate"])

			// Search by tag through the query API the UI uses: each outcome finds exactly
			// the traces, and the frames, that carry it.
			for _, oc := range []string{"indeterminate", "committed", "rolled_back", "committed_with_post_commit_failure"} {
				// Expected from what the SDK ended, not from what Jaeger returned.
				wantTraces, wantFrames := map[string]bool{}, map[string]bool{}
				for _, sr := range rep.scenarios {
					for _, s := range sr.spans {
						if v, _ := spanAttr(s, "tx.outcome"); isFrame(s) && v.AsString() == oc {
							wantTraces[sr.traceID.String()], wantFrames[s.SpanContext().SpanID().String()] = true, true
						}
					}
				}
				if len(wantFrames) == 0 {
					t.Errorf("no frame ended with tx.outcome=%s", oc)
				}
				gotTraces, gotFrames := j.searchByTag(t, ctx, service, "tx.outcome", oc, searchFrom)
				if !mapsEqual(gotTraces, wantTraces) || !mapsEqual(gotFrames, wantFrames) {
					t.Errorf("search tx.outcome=%s: traces %v, frames %v; want traces %v, frames %v", oc,
						keys(gotTraces), keys(gotFrames), keys(wantTraces), keys(wantFrames))
				}
				if oc == "indeterminate" && len(gotFrames) != 1 {
					t.Errorf("search tx.outcome=indeterminate found %d frames, want the one indeterminate frame", len(gotFrames))
				}
			}
			// The service holds exactly the demo's traces: no frame escaped its scenario.
			all := j.findTracesV3(t, ctx, service, searchFrom)
			want := map[string]bool{}
			for _, sr := range rep.scenarios {
				want[sr.traceID.String()] = true
			}
			if !mapsEqual(all, want) {
				t.Errorf("traces of service %s: %v, want the %d scenario traces %v", service, keys(all), len(want), keys(want))
			}
		})
	}
}

// checkScenarios asserts the span contract on what Jaeger returned, scenario by scenario;
// events: transaction-control statements and implicit prepares are events (the default).
func checkScenarios(t *testing.T, tr map[string]*jTrace, events bool) {
	t.Helper()
	// Every trace: one demo root; frames of depth 0 are its children, statement spans
	// are children of frames (or of the reconciliation span, or of the statement they
	// prepare), and every frame has the contract's attributes.
	prepares := 0 // implicit prepares: spans, or with events, pgx.prepare events
	for name, jt := range tr {
		roots := jt.roots()
		if len(roots) != 1 || roots[0].name != "demo."+name {
			t.Errorf("%s: roots %v, want the one span demo.%s", name, spanNames(roots), name)
			continue
		}
		root := roots[0]
		for _, f := range jt.frames() {
			switch {
			case f.isImplicit(): // the statement's own span, otelpgx's
				if f.scope != "github.com/exaring/otelpgx" || f.name != "INSERT" || f.kind != kindClient {
					t.Errorf("%s: implicit frame span %q of %s, kind %d", name, f.name, f.scope, f.kind)
				}
			case f.name != "transaction" || f.kind != kindInternal:
				t.Errorf("%s: frame span %q kind %d", name, f.name, f.kind)
			}
			// A committed implicit frame adds to its statement's span only its outcome, kind
			// and operation id: no tx.phase, no tx.frame.depth.
			committedImplicit := f.isImplicit() && f.attrs["tx.outcome"] == "committed"
			for _, k := range []string{"tx.outcome", "tx.phase", "tx.operation_id", "tx.frame.depth", "tx.propagation", "tx.attempt",
				"db.system.name", "db.namespace", "server.address", "server.port"} {
				noRun := name == "read_only" || f.isImplicit() // plain pgx: no Run
				_, ok := f.attrs[k]
				if !ok && (!noRun || k != "tx.propagation" && k != "tx.attempt") && (!committedImplicit || k != "tx.phase" && k != "tx.frame.depth") {
					t.Errorf("%s: frame %s has no %s", name, f.spanID, k)
				}
				if ok && committedImplicit && (k == "tx.phase" || k == "tx.frame.depth") {
					t.Errorf("%s: committed implicit frame %s has %s", name, f.spanID, k)
				}
			}
			if (f.attrs["tx.frame.depth"] == "0" || committedImplicit) && f.parent != root.spanID {
				t.Errorf("%s: top-level frame %s is not a child of the demo root", name, f.spanID)
			}
			wantStatus(t, name, f)
		}
		for _, s := range jt.spans {
			if s.scope != "github.com/exaring/otelpgx" || s.name == "connect" || s.isImplicit() {
				continue // an implicit frame's span is checked as a frame
			}
			if s.isPrepare() {
				prepares++
			}
			if events && slices.Contains(s.eventNames(), "pgx.prepare") {
				prepares++
			}
			p := jt.byID[s.parent]
			switch {
			case p == nil:
				t.Errorf("%s: statement span %s %q has no parent in the trace", name, s.spanID, s.attrs["db.query.text"])
			case p.isFrame(), p.name == "tx.reconcile", p.scope == "github.com/exaring/otelpgx" && s.isPrepare():
			default:
				t.Errorf("%s: statement span %q is a child of %q, want a frame", name, s.attrs["db.query.text"], p.name)
			}
		}
	}

	if prepares == 0 {
		t.Errorf("no implicit prepare recorded (as a span, or with events as a pgx.prepare event)")
	}

	one := func(name string) *jSpan {
		fs := tr[name].frames()
		if len(fs) != 1 {
			t.Fatalf("%s: %d frames, want 1", name, len(fs))
		}
		return fs[0]
	}

	f := one("committed")
	wantOutcome(t, "committed", f, "committed")
	wantEvents(t, "committed", f, "tx.phase.active", "tx.phase.committing", "tx.phase.committed")
	wantStatements(t, events, "committed", tr["committed"], f, "begin", "insert", "commit")
	wantAttr(t, "committed", f, "tx.phase", "committed")
	if _, ok := f.attrs["tx.reconciliation.xid"]; !ok {
		t.Error("committed: no tx.reconciliation.xid (captured before COMMIT)")
	}

	f = one("rolled_back")
	wantOutcome(t, "rolled_back", f, "rolled_back")
	wantEvents(t, "rolled_back", f, "tx.phase.active", "tx.phase.rolled_back")
	wantStatements(t, events, "rolled_back", tr["rolled_back"], f, "begin", "insert", "rollback")
	wantAttr(t, "rolled_back", f, "tx.retryable", "false")

	// A deliberate Rollback(): rolled back, not an error (wantStatus, by tx.rollback).
	f = one("read_only")
	wantOutcome(t, "read_only", f, "rolled_back")
	wantEvents(t, "read_only", f, "tx.phase.active", "tx.phase.rolled_back")
	wantStatements(t, events, "read_only", tr["read_only"], f, "begin", "select", "rollback")
	wantAttr(t, "read_only", f, "tx.rollback", "deliberate")
	wantAttr(t, "read_only", f, "tx.access_mode", "read only")
	if _, ok := f.attrs["error.type"]; ok {
		t.Errorf("read_only: a deliberate rollback has error.type %q", f.attrs["error.type"])
	}

	f = one("rolled_back_at_commit")
	wantOutcome(t, "rolled_back_at_commit", f, "rolled_back")
	wantEvents(t, "rolled_back_at_commit", f, "tx.phase.active", "tx.phase.committing", "tx.phase.rolled_back")
	wantAttr(t, "rolled_back_at_commit", f, "db.response.status_code", "23505")
	wantAttr(t, "rolled_back_at_commit", f, "error.type", "constraint_violation")
	wantAttr(t, "rolled_back_at_commit", f, "tx.retryable", "false")

	// Serialization failure: every rolled-back attempt is a retryable 40001 followed by
	// tx.retry; both workers end committed, one of them on a later attempt.
	var committedAttempts []string
	rolledBack := 0
	for _, f := range tr["serialization_retry"].frames() {
		wantAttr(t, "serialization_retry", f, "tx.isolation", "serializable")
		switch f.attrs["tx.outcome"] {
		case "committed":
			committedAttempts = append(committedAttempts, f.attrs["tx.attempt"])
			wantEvents(t, "serialization_retry", f, "tx.phase.active", "tx.phase.committing", "tx.phase.committed")
		case "rolled_back":
			rolledBack++
			wantAttr(t, "serialization_retry", f, "tx.retryable", "true")
			wantAttr(t, "serialization_retry", f, "error.type", "serialization_failure")
			wantAttr(t, "serialization_retry", f, "db.response.status_code", "40001")
			ev := f.eventNames()
			if len(ev) < 3 || ev[0] != "tx.phase.active" || ev[len(ev)-2] != "tx.phase.rolled_back" || ev[len(ev)-1] != "tx.retry" {
				t.Errorf("serialization_retry: rolled-back attempt events %v, want active … rolled_back, retry", ev)
			}
		default:
			t.Errorf("serialization_retry: frame outcome %q", f.attrs["tx.outcome"])
		}
	}
	slices.Sort(committedAttempts)
	if rolledBack < 1 || len(committedAttempts) != 2 || committedAttempts[0] != "1" || committedAttempts[1] == "1" {
		t.Errorf("serialization_retry: %d rolled-back attempts, committed attempts %v; want ≥1 and [1 n>1]", rolledBack, committedAttempts)
	}

	// Participating: one frame (the participant has none), holding both inserts; the
	// demo's root records the participant's result.
	f = one("participating")
	wantOutcome(t, "participating", f, "committed")
	wantEvents(t, "participating", f, "tx.phase.active", "tx.participant", "tx.phase.committing", "tx.phase.committed")
	wantStatements(t, events, "participating", tr["participating"], f, "begin", "insert", "insert", "commit")
	if r := tr["participating"].roots()[0].attrs["demo.results"]; !strings.Contains(r, "inner=participating") {
		t.Errorf("participating: demo.results = %s", r)
	}

	// RequiresNew inside Required: two frames, the inner one a child of the outer,
	// one level deeper, between the outer's tx.suspended and tx.resumed.
	fs := tr["nested_frames"].frames()
	if len(fs) != 2 {
		t.Fatalf("nested_frames: %d frames", len(fs))
	}
	outer, inner := fs[0], fs[1]
	if outer.attrs["tx.frame.depth"] != "0" {
		outer, inner = inner, outer
	}
	wantOutcome(t, "nested_frames outer", outer, "rolled_back")
	wantOutcome(t, "nested_frames inner", inner, "committed")
	wantAttr(t, "nested_frames outer", outer, "tx.frame.depth", "0")
	wantAttr(t, "nested_frames inner", inner, "tx.frame.depth", "1")
	wantAttr(t, "nested_frames inner", inner, "tx.propagation", "requires_new")
	if inner.parent != outer.spanID {
		t.Errorf("nested_frames: the inner frame's parent is %s, want the outer frame %s", inner.parent, outer.spanID)
	}
	wantEvents(t, "nested_frames outer", outer, "tx.phase.active", "tx.suspended", "tx.resumed", "tx.phase.rolled_back")
	wantEvents(t, "nested_frames inner", inner, "tx.phase.active", "tx.phase.committing", "tx.phase.committed")
	for _, e := range outer.events {
		if (e.name == "tx.suspended" || e.name == "tx.resumed") && e.attrs["tx.operation_id"] != inner.attrs["tx.operation_id"] {
			t.Errorf("nested_frames: %s names operation %s, want the inner frame's", e.name, e.attrs["tx.operation_id"])
		}
	}
	// The outer frame records tx.suspended once the inner frame has begun, and
	// tx.resumed once the inner frame's outcome is in, before its span ends.
	if len(outer.events) != 4 {
		t.Fatalf("nested_frames: outer frame events %v", outer.eventNames())
	}
	if susp, res := outer.events[1].time, outer.events[2].time; susp < inner.start || res < susp || res > inner.end {
		t.Errorf("nested_frames: tx.suspended@%d and tx.resumed@%d do not lie within the inner frame [%d, %d]", susp, res, inner.start, inner.end)
	}
	wantStatements(t, events, "nested_frames outer", tr["nested_frames"], outer, "begin", "insert", "rollback")
	wantStatements(t, events, "nested_frames inner", tr["nested_frames"], inner, "begin", "insert", "commit")

	f = one("savepoint")
	wantOutcome(t, "savepoint", f, "committed")
	wantEvents(t, "savepoint", f, "tx.phase.active", "tx.savepoint.created", "tx.savepoint.rolled_back", "tx.participant",
		"tx.savepoint.created", "tx.savepoint.released", "tx.participant", "tx.phase.committing", "tx.phase.committed")
	wantStatements(t, events, "savepoint", tr["savepoint"], f, "begin", "insert", "savepoint", "insert", "rollback", "savepoint", "insert", "release", "commit")

	// Two autocommit INSERTs: implicit transactions, each frame the statement's span,
	// children of the demo root.
	if fs := tr["autocommit"].frames(); len(fs) != 2 || !fs[0].isImplicit() || !fs[1].isImplicit() {
		t.Errorf("autocommit: frames %v, want the two statements' spans", spanNames(fs))
	} else {
		wantOutcome(t, "autocommit first", fs[0], "committed")
		// Committed: no phase event (one statement handed over and answered says nothing
		// its span does not).
		wantEvents(t, "autocommit first", fs[0])
		wantOutcome(t, "autocommit second", fs[1], "rolled_back")
		// The statement's error, on its span: otelpgx's exception event.
		wantEvents(t, "autocommit second", fs[1], "tx.phase.active", "tx.phase.committing", "tx.phase.rolled_back", "exception")
		wantAttr(t, "autocommit second", fs[1], "error.type", "constraint_violation")
	}

	f = one("post_commit_failure")
	wantOutcome(t, "post_commit_failure", f, "committed_with_post_commit_failure")
	wantEvents(t, "post_commit_failure", f, "tx.phase.active", "tx.phase.committing", "tx.phase.committed", "tx.post_commit.failed")
	var post *jSpan
	for _, c := range tr["post_commit_failure"].children(f) {
		if c.name == "tx.post_commit" {
			post = c
		}
	}
	if post == nil || post.status != statusError || !slices.Contains(post.eventNames(), "exception") {
		t.Errorf("post_commit_failure: tx.post_commit child span %+v, want status Error with an exception event", post)
	}

	// Indeterminate: status Unset, committing then unknown, the local-commit evidence and
	// the reference; the reconciliation span is a sibling linked to the frame and says
	// committed.
	f = one("indeterminate")
	wantOutcome(t, "indeterminate", f, "indeterminate")
	wantEvents(t, "indeterminate", f, "tx.phase.active", "tx.phase.committing", "tx.phase.unknown")
	wantStatements(t, events, "indeterminate", tr["indeterminate"], f, "begin", "set", "insert", "commit")
	wantAttr(t, "indeterminate", f, "tx.phase", "unknown")
	wantAttr(t, "indeterminate", f, "tx.commit.committed_locally", "true")
	if f.attrs["tx.reconciliation.xid"] == "" || !strings.HasPrefix(f.attrs["tx.reconciliation.ref"], "pg:") || f.attrs["error.type"] == "" {
		t.Errorf("indeterminate: reference %q / %q, error.type %q", f.attrs["tx.reconciliation.xid"], f.attrs["tx.reconciliation.ref"], f.attrs["error.type"])
	}
	var rec *jSpan
	for _, s := range tr["indeterminate"].spans {
		if s.name == "tx.reconcile" {
			rec = s
		}
	}
	switch {
	case rec == nil:
		t.Error("indeterminate: no tx.reconcile span")
	case !slices.Contains(rec.links, f.spanID):
		t.Errorf("indeterminate: tx.reconcile links %v, want the frame %s", rec.links, f.spanID)
	case rec.attrs["tx.outcome.resolved"] != "committed" || rec.attrs["tx.operation_id"] != f.attrs["tx.operation_id"] ||
		rec.attrs["tx.reconciliation.ref"] != f.attrs["tx.reconciliation.ref"]:
		t.Errorf("indeterminate: tx.reconcile attributes %v", rec.attrs)
	case rec.start < f.end:
		t.Error("indeterminate: reconciliation started before the frame ended")
	}
}

func wantStatus(t *testing.T, name string, f *jSpan) {
	t.Helper()
	switch f.attrs["tx.outcome"] {
	case "committed", "committed_with_post_commit_failure":
		if f.status != statusOk {
			t.Errorf("%s: %s frame status %d %q, want Ok", name, f.attrs["tx.outcome"], f.status, f.statusMsg)
		}
	case "rolled_back":
		if f.attrs["tx.rollback"] == "deliberate" {
			if f.status != statusUnset {
				t.Errorf("%s: deliberately rolled_back frame status %d %q, want Unset", name, f.status, f.statusMsg)
			}
		} else if f.status != statusError || f.attrs["tx.rollback"] != "failure" ||
			f.statusMsg != "transaction rolled back" && !f.isImplicit() { // an implicit frame's is its statement's error

			t.Errorf("%s: rolled_back frame status %d %q, tx.rollback %q, want Error \"transaction rolled back\", failure",
				name, f.status, f.statusMsg, f.attrs["tx.rollback"])
		}
	case "indeterminate":
		if f.status != statusUnset {
			t.Errorf("%s: indeterminate frame status %d %q, want Unset", name, f.status, f.statusMsg)
		}
	default:
		t.Errorf("%s: frame tx.outcome %q", name, f.attrs["tx.outcome"])
	}
}

func wantOutcome(t *testing.T, name string, f *jSpan, want string) {
	t.Helper()
	wantAttr(t, name, f, "tx.outcome", want)
}

func wantAttr(t *testing.T, name string, s *jSpan, k, want string) {
	t.Helper()
	if got, ok := s.attrs[k]; !ok || got != want {
		t.Errorf("%s: span %s %s = %q, want %q", name, s.name, k, got, want)
	}
}

// wantEvents compares a span's events in time order (Jaeger's v3 API sorts them by name).
func wantEvents(t *testing.T, name string, s *jSpan, want ...string) {
	t.Helper()
	if got := s.eventNames(); !slices.Equal(got, want) {
		t.Errorf("%s: events of %s in time order %v, want %v", name, s.name, got, want)
	}
}

// wantStatements compares the first words of the statements of a frame, in time order,
// with want: the statement spans directly under it (prepare spans left out), and, with
// events, the transaction-control statements among want as its events that carry
// db.operation.name and tx.statement.duration instead.
func wantStatements(t *testing.T, events bool, name string, jt *jTrace, f *jSpan, want ...string) {
	t.Helper()
	var spans, ops []string
	for _, w := range want {
		if events && slices.Contains([]string{"begin", "commit", "rollback", "savepoint", "release"}, w) {
			ops = append(ops, strings.ToUpper(w))
		} else {
			spans = append(spans, w)
		}
	}
	var got, gotOps []string
	for _, c := range jt.children(f) {
		if q, ok := c.attrs["db.query.text"]; ok && !c.isPrepare() {
			got = append(got, strings.ToLower(strings.Fields(q)[0]))
		}
	}
	for _, e := range f.events {
		if op, ok := e.attrs["db.operation.name"]; ok {
			gotOps = append(gotOps, op)
			if d, err := strconv.ParseFloat(e.attrs["tx.statement.duration"], 64); err != nil || d <= 0 {
				t.Errorf("%s: event %s of %s: tx.statement.duration %q", name, e.name, op, e.attrs["tx.statement.duration"])
			}
		}
	}
	if !slices.Equal(got, spans) || !slices.Equal(gotOps, ops) {
		t.Errorf("%s: statements under the frame %v and its statement events %v, want %v and %v", name, got, gotOps, spans, ops)
	}
}

// checkIndeterminateLog: the library logged the indeterminate commit with what
// reconciliation needs, and the trace id of the frame Jaeger holds.
func checkIndeterminateLog(t *testing.T, log string, jt *jTrace) {
	t.Helper()
	f := jt.frames()[0]
	for _, want := range []string{
		"level=WARN",
		"tx.operation_id=" + f.attrs["tx.operation_id"],
		"trace_id=" + f.traceID,
		"span_id=" + f.spanID,
		// slog's text handler quotes a value with ";" or "=" in it, as ";flushed=…".
		"tx.reconciliation.ref=" + strconv.Quote(f.attrs["tx.reconciliation.ref"]),
		"tx.commit.committed_locally=true",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the indeterminate log record lacks %q; log:\n%s", want, log)
		}
	}
}

// sameSpans asserts that Jaeger returned every span the SDK ended, unchanged: name,
// kind, parent, timestamps, status, attributes, events and links.
func sameSpans(t *testing.T, name string, want []sdktrace.ReadOnlySpan, got *jTrace) {
	t.Helper()
	if len(got.spans) != len(want) {
		t.Errorf("%s: Jaeger holds %d spans, the SDK ended %d", name, len(got.spans), len(want))
	}
	for _, w := range want {
		id := w.SpanContext().SpanID().String()
		g := got.byID[id]
		if g == nil {
			t.Errorf("%s: span %s %q missing in Jaeger", name, id, w.Name())
			continue
		}
		parent := ""
		if w.Parent().IsValid() {
			parent = w.Parent().SpanID().String()
		}
		if g.name != w.Name() || g.parent != parent || g.kind != int(w.SpanKind()) || g.scope != w.InstrumentationScope().Name ||
			g.start != w.StartTime().UnixNano() || g.end != w.EndTime().UnixNano() {
			t.Errorf("%s: span %s: Jaeger has %q parent %s kind %d scope %s [%d, %d], SDK %q parent %s kind %d scope %s [%d, %d]", name, id,
				g.name, g.parent, g.kind, g.scope, g.start, g.end,
				w.Name(), parent, w.SpanKind(), w.InstrumentationScope().Name, w.StartTime().UnixNano(), w.EndTime().UnixNano())
		}
		if st := w.Status(); g.status != statusCode(st.Code) || g.statusMsg != st.Description {
			t.Errorf("%s: span %s %q status %d %q, SDK %v %q", name, id, w.Name(), g.status, g.statusMsg, st.Code, st.Description)
		}
		for _, kv := range w.Attributes() {
			if v, ok := g.attrs[string(kv.Key)]; !ok || v != emit(kv.Value) {
				t.Errorf("%s: span %s %q attribute %s = %q in Jaeger, %q in the SDK", name, id, w.Name(), kv.Key, v, emit(kv.Value))
			}
		}
		// Same events, matched by name and timestamp (the order of two events with the
		// same timestamp is not defined).
		if len(g.events) != len(w.Events()) {
			t.Errorf("%s: span %s %q has %d events in Jaeger, %d in the SDK", name, id, w.Name(), len(g.events), len(w.Events()))
		}
		used := make([]bool, len(g.events))
		for _, e := range w.Events() {
			found := false
			for i, ge := range g.events {
				if used[i] || ge.name != e.Name || ge.time != e.Time.UnixNano() {
					continue
				}
				used[i], found = true, true
				for _, kv := range e.Attributes {
					if ge.attrs[string(kv.Key)] != emit(kv.Value) {
						t.Errorf("%s: span %s event %s attribute %s = %q, SDK %q", name, id, e.Name, kv.Key, ge.attrs[string(kv.Key)], emit(kv.Value))
					}
				}
				break
			}
			if !found {
				t.Errorf("%s: span %s %q: event %s@%d missing in Jaeger", name, id, w.Name(), e.Name, e.Time.UnixNano())
			}
		}
		var links []string
		for _, l := range w.Links() {
			links = append(links, l.SpanContext.SpanID().String())
		}
		if !slices.Equal(links, g.links) {
			t.Errorf("%s: span %s links %v in Jaeger, %v in the SDK", name, id, g.links, links)
		}
	}
}

// emit renders an attribute value as the Jaeger side is flattened below.
func emit(v attribute.Value) string {
	if v.Type() == attribute.STRINGSLICE {
		return strings.Join(v.AsStringSlice(), "\x00")
	}
	return v.String()
}

// checkAlertRulesAgainstMetrics: every metric and tx_outcome value alerts.yml and
// alerts_test.yml use is one the library really exports through the Prometheus exporter.
func checkAlertRulesAgainstMetrics(t *testing.T, a *app) {
	t.Helper()
	mfs, err := a.registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, mf := range mfs {
		exported[mf.GetName()] = true
	}
	for _, name := range []string{"otelpgxtx_participations_total", "otelpgxtx_transaction_duration_seconds", "otelpgxtx_transaction_commit_duration_seconds"} {
		if !exported[name] {
			t.Errorf("the Prometheus exporter does not write %s; it writes %v", name, keys(exported))
		}
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	b, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("alerts_test.yml")
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{string(tests)}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			texts = append(texts, r.Expr)
			n++
		}
	}
	if n != len(alertNames) {
		t.Errorf("alerts.yml has %d rules, want %d", n, len(alertNames))
	}
	metricRe := regexp.MustCompile(`\botelpgxtx_[a-z_]+`)
	outcomeRe := regexp.MustCompile(`tx_outcome="([^"]*)"`)
	for _, text := range texts {
		for _, m := range metricRe.FindAllString(text, -1) {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_count"), "_sum")
			if !exported[m] && !exported[base] {
				t.Errorf("the alert rules use %s, which the library does not export", m)
			}
		}
		for _, m := range outcomeRe.FindAllStringSubmatch(text, -1) {
			if o, err := outcome.ParseOutcome(m[1]); err != nil || o == outcome.OutcomeParticipating {
				t.Errorf("the alert rules use tx_outcome=%q, which is never exported", m[1])
			}
		}
	}
}
