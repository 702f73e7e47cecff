//go:build soak

package otelpgxtx

// The soak's checker (see soak_test.go): what it records of the spans while the soak
// runs, and its steps once the server is quiet, each comparing one record with the
// database or with another record, then the report.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/metrics"
	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// soakFrame is what the checker needs of one ended frame span.
type soakFrame struct {
	span, parent     trace.SpanID
	trace            trace.TraceID
	start            time.Time
	outcome, phase   string
	op, ref, errType string
	sqlstate         string
	attempt          int64
	committedLocally bool
	participants     map[string]int64 // tx.participant events by tx.participant.outcome
	events           []string         // an indeterminate frame without a reference: its events, to tell why
}

// soakSpans is a span processor that records the start and end of every span of this
// library's scope, and the frame spans' attributes. It keeps nothing else, so that a long
// run does not hold hundreds of thousands of statement spans in memory.
type soakSpans struct {
	mu      sync.Mutex
	started map[trace.SpanID]string
	ends    map[trace.SpanID]int
	frames  []soakFrame
	// reconciles are the tx.reconcile spans, by operation id, in end order.
	reconciles map[string][]string
	// retries are the otelpgxtx.retry spans' parents: a Retry call's frames are its
	// children, and belong to the operation its parent is.
	retries map[trace.SpanID]trace.SpanID
}

// soakScope reports a span of the library's: the tracer's, or the reconciler's.
func soakScope(name string) bool { return name == ScopeName || name == reconcile.ScopeName }

func (p *soakSpans) OnStart(_ context.Context, s sdktrace.ReadWriteSpan) {
	if !soakScope(s.InstrumentationScope().Name) {
		return
	}
	p.mu.Lock()
	p.started[s.SpanContext().SpanID()] = s.Name()
	p.mu.Unlock()
}

func (p *soakSpans) OnEnd(s sdktrace.ReadOnlySpan) {
	if !soakScope(s.InstrumentationScope().Name) {
		return
	}
	var fr soakFrame
	isFrame := false
	if s.Name() == DefaultSpanName {
		isFrame = true
		fr = soakFrame{span: s.SpanContext().SpanID(), trace: s.SpanContext().TraceID(), parent: s.Parent().SpanID(), start: s.StartTime()}
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case OutcomeKey:
				fr.outcome = kv.Value.AsString()
			case PhaseKey:
				fr.phase = kv.Value.AsString()
			case OperationIDKey:
				fr.op = kv.Value.AsString()
			case ReconciliationRefKey:
				fr.ref = kv.Value.AsString()
			case schema.ErrorTypeKey:
				fr.errType = kv.Value.AsString()
			case schema.DBResponseStatusKey:
				fr.sqlstate = kv.Value.AsString()
			case AttemptKey:
				fr.attempt = kv.Value.AsInt64()
			case CommittedLocallyKey:
				fr.committedLocally = kv.Value.AsBool()
			}
		}
		for _, e := range s.Events() {
			if fr.outcome == "indeterminate" && fr.ref == "" {
				fr.events = append(fr.events, e.Name)
			}
			if e.Name != schema.EventParticipant {
				continue
			}
			for _, kv := range e.Attributes {
				if kv.Key == schema.ParticipantOutcomeKey {
					if fr.participants == nil {
						fr.participants = map[string]int64{}
					}
					fr.participants[kv.Value.AsString()]++
				}
			}
		}
	}
	if s.Name() == SpanNameReconcile {
		var op, resolved, reason string
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case OperationIDKey:
				op = kv.Value.AsString()
			case ResolvedOutcomeKey:
				resolved = kv.Value.AsString()
			case schema.ErrorTypeKey:
				reason = kv.Value.AsString()
			}
		}
		p.mu.Lock()
		p.reconciles[op] = append(p.reconciles[op], resolved+"/"+reason)
		p.mu.Unlock()
	}
	p.mu.Lock()
	p.ends[s.SpanContext().SpanID()]++
	if isFrame {
		p.frames = append(p.frames, fr)
	}
	if s.Name() == schema.SpanNameRetry {
		if p.retries == nil {
			p.retries = map[trace.SpanID]trace.SpanID{}
		}
		p.retries[s.SpanContext().SpanID()] = s.Parent().SpanID()
	}
	p.mu.Unlock()
}

func (p *soakSpans) Shutdown(context.Context) error   { return nil }
func (p *soakSpans) ForceFlush(context.Context) error { return nil }

// soakAtSource reports an error.type the tracer gives a COMMIT it proved never executed.
func soakAtSource(errType string) bool {
	return errType == classifier.ReasonCommitNotSent || errType == classifier.ReasonSessionEndedBeforeCommit ||
		errType == classifier.ReasonIdleInTransactionTimeout
}

// soakViolation is one finding of the checker: the operation it is about (0: none) and
// what is wrong.
type soakViolation struct {
	op   int64
	what string
}

// check compares what the soak recorded with the database and with itself, once the
// server is back and quiet, step by step, then reports: the figures in the test's log,
// each violation as an error. The order matters: a step reads what the steps before it
// gathered (the rows, the frames, which operation each frame belongs to).
func (s *soak) check(ctx context.Context, workload, total time.Duration) {
	c := newSoakCheck(ctx, s)
	c.framesLeftOnConnections()
	c.databaseRows()
	c.spansEndedOnce()
	c.framesAgainstRows()
	c.metricsAgainstSpans()
	c.automaticReconciliation()
	c.reconcilingReferences()
	c.harnessErrors()
	c.report(workload, total)
}

// soakCheck is the checker's state: the violations found so far, and what each step
// gathers for the steps after it and for the report.
type soakCheck struct {
	s   *soak
	t   *testing.T
	ctx context.Context
	bad []soakViolation
	ops []soakOp // the operations that ran

	// databaseRows: the table, each row's id and the operation id it names; the
	// increments' counters by operation, and the frames that committed one.
	rows     map[int64]string
	counters map[int64]int
	incrBy   map[string]int64

	// increments: by arm (retry on error, with the verdict), the report's counts.
	incr map[string]*soakIncrCounts

	// spansEndedOnce: the frame spans, how many spans of the library's scope started and
	// ended, and the tx.reconcile spans by operation id (before the checker's own).
	frames         []soakFrame
	started, ended int
	autoSpans      map[string][]string

	// framesAgainstRows: the operation of each frame, and the report's counts.
	opOfFrame      map[*soakFrame]*soakOp
	frameOutcomes  map[soakPathKey]int // frame spans by path and tx.outcome
	resultOutcomes map[soakPathKey]int // per operation: Run's result, plain pgx's last frame
	indetTruth     map[string]int      // "pgx: committed" ...: indeterminate frames against the table
	lost           map[string]int      // committed locally, lost in a failover, by path
	atSource       map[string]int      // frames made determinate at the source, by mode
	indetFrames    map[string]int      // indeterminate frames, by mode

	// automaticReconciliation.
	indeterminate int            // indeterminate frame spans
	autoByMode    map[string]int // mode: resolution → callbacks
	notReplicated int            // attempts a barrier gave up on, retried

	// reconcilingReferences.
	reconciled   map[string]int // mode: resolution → Reconcile's answers
	indetResults map[string]int // indeterminate Run results, by mode
	settled      map[string]int // Reconcile's answers other than unknown, by mode
	resolvedRefs map[string]int // "outcome → resolution": Resolve of every frame's reference
}

// newSoakCheck starts a check of s with the operations that ran, since an operation the
// workload never reached has nothing to compare.
func newSoakCheck(ctx context.Context, s *soak) *soakCheck {
	c := &soakCheck{s: s, t: s.t, ctx: ctx}
	for i := range s.ops {
		if s.ops[i].ran {
			c.ops = append(c.ops, s.ops[i])
		}
	}
	return c
}

// fail records a violation about operation id (0: about none).
func (c *soakCheck) fail(id int64, format string, args ...any) {
	c.bad = append(c.bad, soakViolation{id, fmt.Sprintf(format, args...)})
}

// framesLeftOnConnections checks that no idle pooled connection still holds a frame,
// because every transaction has ended by now and a frame left behind would never be
// reported.
func (c *soakCheck) framesLeftOnConnections() {
	s := c.s
	pools := []*pgxpool.Pool{s.direct, s.proxied}
	for _, ps := range s.refPools {
		pools = append(pools, ps[:]...)
	}
	for _, p := range pools {
		conns := p.AcquireAllIdle(c.ctx)
		for _, pc := range conns {
			if st := frame.Made(pc.Conn().PgConn()); st != nil && st.Frame() != nil {
				c.fail(0, "an idle pooled connection still holds a frame in phase %s (operation %s)", st.Frame().Ev.Phase(), st.Frame().ID)
			}
			pc.Release()
		}
	}
}

// databaseRows reads the workload's rows, because the table is the ground truth every
// later step compares a reported outcome with.
func (c *soakCheck) databaseRows() {
	t := c.t
	c.rows = map[int64]string{}
	r, err := c.s.admin.Query(c.ctx, "select id, op from soak_rows where id > 0")
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var id int64
		var op string
		if err := r.Scan(&id, &op); err != nil {
			t.Fatal(err)
		}
		c.rows[id] = op
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	c.counters, c.incrBy = map[int64]int{}, map[string]int64{}
	var id int64
	var n int
	var frame string
	c.scanRows("select id, n from soak_counter", func() { c.counters[id] = n }, &id, &n)
	c.scanRows("select frame, id from soak_incr", func() { c.incrBy[frame] = id }, &frame, &id)
}

// scanRows scans each row of query into dst and calls each after it.
func (c *soakCheck) scanRows(query string, each func(), dst ...any) {
	r, err := c.s.admin.Query(c.ctx, query)
	if err != nil {
		c.t.Fatal(err)
	}
	for r.Next() {
		if err := r.Scan(dst...); err != nil {
			c.t.Fatal(err)
		}
		each()
	}
	if err := r.Err(); err != nil {
		c.t.Fatal(err)
	}
}

// committedBy reports whether the table holds what frame (an operation id) of op
// wrote: op's row naming it, or, for an increment, its soak_incr row.
func (c *soakCheck) committedBy(op *soakOp, frame string) bool {
	if op.incr {
		id, ok := c.incrBy[frame]
		return ok && id == op.id
	}
	row, present := c.rows[op.id]
	return present && row == frame
}

// spansEndedOnce checks that every span of the library's scope that started was ended
// exactly once, because a span never ended is never exported, and takes the frame spans and
// the tx.reconcile spans seen so far for the steps after it.
func (c *soakCheck) spansEndedOnce() {
	sp := c.s.spans
	sp.mu.Lock()
	c.frames = slices.Clone(sp.frames)
	for i := range c.frames {
		if op, ok := sp.retries[c.frames[i].parent]; ok {
			c.frames[i].parent = op // a Retry attempt's frame is the operation's
		}
	}
	unended := 0
	for id, name := range sp.started {
		if n := sp.ends[id]; n != 1 {
			unended++
			if unended <= 5 {
				c.fail(0, "span %s %q ended %d times", id, name, n)
			}
		}
	}
	c.started, c.ended = len(sp.started), len(sp.ends)
	c.autoSpans = maps.Clone(sp.reconciles) // before the checker's own reconciliations
	sp.mu.Unlock()
}

// framesAgainstRows checks each operation's frame spans against its row (committed:
// present; rolled_back: absent; a present row written by one of its frames) and against
// what the caller saw (checkPlain, checkRun), and that no frame belongs to no operation,
// because a frame's tx.outcome is the promise the library makes about the database.
func (c *soakCheck) framesAgainstRows() {
	s, frames := c.s, c.frames
	byParent := map[trace.SpanID][]*soakFrame{}
	for i := range frames {
		byParent[frames[i].parent] = append(byParent[frames[i].parent], &frames[i])
	}
	for _, fs := range byParent {
		slices.SortFunc(fs, func(a, b *soakFrame) int { return a.start.Compare(b.start) })
	}
	orphans := len(frames)

	c.frameOutcomes, c.resultOutcomes = map[soakPathKey]int{}, map[soakPathKey]int{}
	c.indetTruth, c.lost, c.atSource, c.indetFrames = map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	c.opOfFrame = map[*soakFrame]*soakOp{}

	for i := range c.ops {
		op := &c.ops[i]
		fs := byParent[op.span]
		orphans -= len(fs)
		row, present := c.rows[op.id]
		if op.incr {
			present, row = false, "" // its rows are in soak_counter and soak_incr
		}
		known := false
		for _, f := range fs {
			c.opOfFrame[f] = op
			c.frameOutcomes[soakPathKey{op.path(), f.outcome}]++
			if soakAtSource(f.errType) {
				// Checked below like every rolled_back frame: its row must be absent.
				c.atSource[op.mode()]++
				if f.outcome != "rolled_back" {
					c.fail(op.id, "frame %s has error.type %s but tx.outcome %s", f.op, f.errType, f.outcome)
				}
			}
			if f.outcome == "indeterminate" {
				c.indetFrames[op.mode()]++
			}
			here := c.committedBy(op, f.op)
			known = known || here
			switch f.outcome {
			case "committed", "committed_with_post_commit_failure":
				if !here && s.lostInFailover(f) {
					c.lost[op.path()]++
				} else if !here {
					c.fail(op.id, "%s frame %s says %s; its row is absent (row names %q) [%s]", op.path(), f.op, f.outcome, row, op.describe())
				}
			case "rolled_back":
				if here {
					c.fail(op.id, "%s frame %s says rolled_back (%s %s); its row is present [%s]", op.path(), f.op, f.errType, f.sqlstate, op.describe())
				}
			case "indeterminate":
				if here {
					c.indetTruth[op.path()+": committed"]++
				} else {
					c.indetTruth[op.path()+": not committed"]++
				}
			default:
				c.fail(op.id, "%s frame %s has tx.outcome %q", op.path(), f.op, f.outcome)
			}
		}
		if present && !known {
			c.fail(op.id, "row %d was committed by %q, which is none of the operation's %d frame(s) [%s]", op.id, row, len(fs), op.describe())
		}
		if op.run {
			c.checkRun(op, fs, present, row)
			c.resultOutcomes[soakPathKey{"run", op.res.Outcome().String()}]++
		} else {
			if op.incr {
				c.checkIncrement(op, fs)
			} else {
				c.checkPlain(op, fs, present)
			}
			o := "none (BEGIN failed before a frame)"
			if len(fs) > 0 {
				o = fs[len(fs)-1].outcome
			}
			c.resultOutcomes[soakPathKey{"pgx", o}]++
		}
	}
	if orphans != 0 {
		c.fail(0, "%d frame span(s) belong to no operation", orphans)
	}
}

// metricsAgainstSpans checks that the metrics count what the spans say (frames by
// outcome, participant calls by theirs), because a dashboard reads the metrics, not the
// spans.
func (c *soakCheck) metricsAgainstSpans() {
	t, ctx := c.t, c.ctx
	h := &harness{reader: c.s.reader}
	metricCounts := nonZero(h.countsByOutcome(t, ctx)) // every outcome's series starts at 0
	spanCounts := map[string]int64{}
	participantCounts := map[string]int64{}
	for _, f := range c.frames {
		spanCounts[f.outcome]++
		for o, n := range f.participants {
			participantCounts["tx.participant.outcome="+o] += n
		}
	}
	if fmt.Sprint(metricCounts) != fmt.Sprint(spanCounts) {
		c.fail(0, "metrics by outcome %v, frame spans by outcome %v", metricCounts, spanCounts)
	}
	if got := nonZero(h.sums(t, ctx, metrics.MetricParticipations, schema.ParticipantOutcomeKey)); fmt.Sprint(got) != fmt.Sprint(participantCounts) {
		c.fail(0, "participations by outcome %v, tx.participant events %v", got, participantCounts)
	}
}

// automaticReconciliation checks that every indeterminate frame got exactly one final
// answer from automatic reconciliation, none contradicting the table, with its last
// tx.reconcile span and the reconciliation metrics saying the same, because that answer is
// what settles an indeterminate frame for the operator.
func (c *soakCheck) automaticReconciliation() {
	s, frames := c.s, c.frames
	s.autoMu.Lock()
	auto := maps.Clone(s.auto)
	s.autoMu.Unlock()
	autoCounts := map[string]int{} // resolution/reason → callbacks
	c.autoByMode = map[string]int{}
	for i := range frames {
		f := &frames[i]
		if f.outcome != "indeterminate" {
			continue
		}
		c.indeterminate++
		op := c.opOfFrame[f]
		got := auto[f.op]
		delete(auto, f.op)
		if len(got) != 1 {
			c.fail(0, "indeterminate frame %s reconciled automatically %d times, want once", f.op, len(got))
			continue
		}
		r := got[0].Answer
		key := r.Status().String() + "/" + r.Reason()
		autoCounts[key]++
		if op == nil {
			continue
		}
		label := op.mode() + ": " + soakResolutionLabel(r)
		if r.Reason() == reconcile.ReasonCrashRecovered {
			// What the evidence left open: a commit it cannot prove, or a loss it did not.
			label += map[bool]string{true: " (committed)", false: " (did not commit)"}[c.committedBy(op, f.op)]
		}
		c.autoByMode[label]++
		if op.run && op.marker && f.ref == "" {
			// Issue 40's long run found four of these and not why: say it for each.
			c.t.Logf("Run with the marker, no reference: frame %s, phase %s, error %s, sqlstate %q, events %v [%s]",
				f.op, f.phase, f.errType, f.sqlstate, f.events, op.describe())
		}
		if (f.ref != "") == (r.Reason() == reconcile.ReasonNoReference) {
			c.fail(op.id, "frame %s with reference %q reconciled automatically %s", f.op, f.ref, key)
		}
		here := c.committedBy(op, f.op)
		if got[0].CommittedLocally != f.committedLocally {
			c.fail(op.id, "frame %s: committed_locally %v, the reconciliation says %v", f.op, f.committedLocally, got[0].CommittedLocally)
		}
		// A committed answer waited for the synchronous standby (the replication barrier),
		// so a later failover keeps what it confirmed: any loss is a contradiction.
		if msg := soakResolutionContradicts(r, here); msg != "" {
			c.fail(op.id, "automatic reconciliation of frame %s: %s [%s]", f.op, msg, op.describe())
		}
		spans := c.autoSpans[f.op]
		for _, sp := range spans {
			if sp == reconcile.Unknown.String()+"/"+reconcile.ReasonNotReplicated {
				c.notReplicated++
			}
		}
		switch r.Reason() {
		case reconcile.ReasonQueueFull, reconcile.ReasonStopped:
			// Settled without a final attempt: every span it has is a retried one.
		default:
			if len(spans) == 0 || spans[len(spans)-1] != key {
				c.fail(op.id, "frame %s reconciled %s; its tx.reconcile spans say %v", f.op, key, spans)
			}
		}
	}
	for op, rs := range auto {
		c.fail(0, "automatic reconciliation of %s (%d answers), which is no indeterminate frame", op, len(rs))
	}
	counts, _, _ := (&harness{reader: s.reader}).reconcileCounts(c.t, c.ctx)
	metricAuto := map[string]int{}
	for k, n := range counts {
		if n > 0 { // every series starts at 0
			metricAuto[k] = int(n)
		}
	}
	if fmt.Sprint(metricAuto) != fmt.Sprint(autoCounts) {
		c.fail(0, "reconciliation metrics %v, callbacks %v", metricAuto, autoCounts)
	}
	total := 0
	for _, n := range metricAuto {
		total += n
	}
	if total != c.indeterminate {
		c.fail(0, "reconciliation metrics count %d, indeterminate frame spans %d", total, c.indeterminate)
	}
}

// reconcilingReferences reconciles every indeterminate Run result and resolves every
// reference on any frame span, checking each answer against the table, because a caller
// or an operator settles an indeterminate outcome this way long after the fact.
func (c *soakCheck) reconcilingReferences() {
	s, ctx, frames := c.s, c.ctx, c.frames
	rec, err := reconcile.New(s.admin, reconcile.WithTracerProvider(s.tp), reconcile.WithWait(5*time.Second, 10*time.Millisecond))
	if err != nil {
		c.t.Fatal(err)
	}
	c.reconciled = map[string]int{}
	c.indetResults, c.settled = map[string]int{}, map[string]int{}
	for i := range c.ops {
		op := &c.ops[i]
		ind, ok := op.res.(outcome.Indeterminate[int64])
		if !ok {
			continue
		}
		c.indetResults[op.mode()]++
		got, err := reconcile.Indeterminate(ctx, rec, ind)
		if err != nil {
			c.fail(op.id, "Reconcile: %v", err)
			continue
		}
		row, present := c.rows[op.id]
		here := present && row == ind.OperationID().String()
		c.reconciled[op.mode()+": "+soakResolutionLabel(got)]++
		if got.Status() != reconcile.Unknown {
			c.settled[op.mode()]++
		}
		if msg := soakResolutionContradicts(got, here); msg != "" {
			c.fail(op.id, "Reconcile of an indeterminate Run result: %s [%s]", msg, op.describe())
		}
	}
	c.resolvedRefs = map[string]int{}
	for i := range frames {
		f := &frames[i]
		if f.ref == "" {
			continue
		}
		ref, err := outcome.ParseReconciliationRef(f.ref)
		if err != nil {
			c.fail(0, "frame %s: tx.reconciliation.ref %q: %v", f.op, f.ref, err)
			continue
		}
		got, err := rec.Resolve(ctx, ref, trace.NewSpanContext(trace.SpanContextConfig{TraceID: f.trace, SpanID: f.span, TraceFlags: trace.FlagsSampled}))
		if err != nil {
			c.fail(0, "Resolve %s: %v", ref, err)
			continue
		}
		op := c.opOfFrame[f]
		if op == nil {
			continue
		}
		here := c.committedBy(op, f.op)
		c.resolvedRefs[f.outcome+" → "+soakResolutionLabel(got)]++
		if f.outcome == "indeterminate" && !op.run {
			// Plain pgx has no Result: its indeterminate frames are what Reconcile settles.
			c.reconciled[op.mode()+": "+soakResolutionLabel(got)]++
			if got.Status() != reconcile.Unknown {
				c.settled[op.mode()]++
			}
		}
		if msg := soakResolutionContradicts(got, here); msg != "" {
			c.fail(op.id, "Resolve of the reference %s of a %s frame %s: %s [%s]", ref, f.outcome, f.op, msg, op.describe())
		}
		if f.outcome == "committed" && got.Status() == reconcile.Aborted && !(!here && s.lostInFailover(f)) ||
			f.outcome == "rolled_back" && got.Status() == reconcile.Committed {
			c.fail(op.id, "the reconciler says %s of a frame the tracer saw %s", got.Status(), f.outcome)
		}
	}
}

// harnessErrors fails the check with each unexpected error of the soak's own machinery
// (not of the workload), because a harness that broke may have checked less than it says.
func (c *soakCheck) harnessErrors() {
	for k, n := range c.s.errs.snapshot() {
		c.fail(0, "harness: %s (%d times)", k, n)
	}
}

// report logs the run's figures and fails the test with each violation (the first 30),
// because the figures show how much of each fault the run exercised, pass or fail.
func (c *soakCheck) report(workload, total time.Duration) {
	s, t, frames := c.s, c.t, c.frames
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	fmt.Fprintf(&b, "\nsoundness: seed %d, %d workers, %d operations (of %d) in %s (workload %s), %d frame spans, %d/%d library spans ended\n",
		s.cfg.seed, s.cfg.workers, len(c.ops), s.cfg.tx, total.Round(time.Millisecond), workload.Round(time.Millisecond), len(frames), c.ended, c.started)
	fmt.Fprintln(&b, "\nframe spans by tx.outcome (every physical transaction, retries included):")
	soakPrintByPath(tw, c.frameOutcomes)
	tw.Flush()
	fmt.Fprintln(&b, "\nper operation: Run's returned result / plain pgx's last frame span:")
	soakPrintByPath(tw, c.resultOutcomes)
	tw.Flush()
	fmt.Fprintln(&b, "\nfaults injected:")
	faults := s.faults.snapshot()
	var dup, serialFailures, deadlines int
	for i := range frames {
		switch {
		case frames[i].sqlstate == "23505" && frames[i].phase == "rolled_back" && strings.Contains(frames[i].errType, "constraint"):
			dup++
		case frames[i].sqlstate == "40001":
			serialFailures++
		}
		if frames[i].errType == "deadline_exceeded" && frames[i].outcome == "indeterminate" {
			deadlines++
		}
	}
	faults["workload: deferred unique violation (23505 frames)"] = dup
	faults["workload: serialization failure (40001 frames)"] = serialFailures
	faults["client: context deadline during COMMIT (indeterminate frames)"] = deadlines
	faults["proxy: connections cut (fired)"] = int(s.proxy.Cuts())
	for _, k := range slices.Sorted(maps.Keys(faults)) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", k, faults[k])
	}
	tw.Flush()
	fmt.Fprintln(&b, "\nindeterminate frames, ground truth after the fact:")
	for _, k := range slices.Sorted(maps.Keys(c.indetTruth)) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", k, c.indetTruth[k])
	}
	tw.Flush()
	if s.cluster != nil {
		fmt.Fprintln(&b, "\ncommitted locally (synchronous-replication wait ended), lost in a failover:")
		for _, k := range slices.Sorted(maps.Keys(c.lost)) {
			fmt.Fprintf(tw, "  %s\t%d\t\n", k, c.lost[k])
		}
		tw.Flush()
	}
	fmt.Fprintf(&b, "\nautomatic reconciliation of the %d indeterminate frames (one answer each; metrics = callbacks = spans):\n", c.indeterminate)
	for _, k := range slices.Sorted(maps.Keys(c.autoByMode)) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", k, c.autoByMode[k])
	}
	fmt.Fprintf(tw, "  attempts unknown %s (retried)\t%d\t\n", reconcile.ReasonNotReplicated, c.notReplicated)
	tw.Flush()
	fmt.Fprintln(&b, "\nReconcile on indeterminate Run results, and on the references of indeterminate plain pgx frames:")
	for _, k := range slices.Sorted(maps.Keys(c.reconciled)) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", k, c.reconciled[k])
	}
	tw.Flush()
	fmt.Fprintln(&b, "\nsettled, by mode: indeterminate frames; made determinate at the source (each checked against the table);")
	fmt.Fprintln(&b, "indeterminate results; settled by Reconcile; settled of all that would have been indeterminate:")
	for _, m := range []string{"pgx", "pgx, xid only", "pgx, xid + marker", "run, xid only", "run, xid + marker"} {
		would := c.atSource[m] + c.indetResults[m]
		if strings.HasPrefix(m, "pgx") {
			would = c.atSource[m] + c.indetFrames[m]
		}
		pct := 0.0
		if would > 0 {
			pct = 100 * float64(c.atSource[m]+c.settled[m]) / float64(would)
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%.1f%%\t\n", m, c.indetFrames[m], c.atSource[m], c.indetResults[m], c.settled[m], pct)
	}
	tw.Flush()
	fmt.Fprintln(&b, "\nResolve on every frame span's reference (outcome → resolution):")
	for _, k := range slices.Sorted(maps.Keys(c.resolvedRefs)) {
		fmt.Fprintf(tw, "  %s\t%d\t\n", k, c.resolvedRefs[k])
	}
	tw.Flush()
	fmt.Fprintln(&b, "\nnon-idempotent increments through a retry loop, by arm: operations, calls, applications, applied twice or more,")
	fmt.Fprintln(&b, "indeterminate verdicts, of those with a reference, settled by reconciliation, Retry calls without a verdict,")
	fmt.Fprintln(&b, "last verdicts of a transaction that never reached the server (no connection; retried while attempts lasted):")
	for _, arm := range slices.Sorted(maps.Keys(c.incr)) {
		k := c.incr[arm]
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", arm, k.ops, k.calls, k.applied, k.double, k.indeterminate, k.withRef, k.settled, k.noVerdict, k.notReached)
	}
	tw.Flush()
	fmt.Fprintf(&b, "\nmisclassifications: %d\n", len(c.bad))
	t.Log(b.String())
	for i, v := range c.bad {
		if i == 30 {
			t.Errorf("… and %d more", len(c.bad)-i)
			break
		}
		t.Errorf("operation %d: %s", v.op, v.what)
	}
}

// lostInFailover reports whether a committed frame may be absent from the surviving
// history: it only committed locally, on a cluster that failed over.
func (s *soak) lostInFailover(f *soakFrame) bool {
	return s.cluster != nil && f.committedLocally
}

// soakPathKey counts outcomes per path ("pgx", "run").
type soakPathKey struct{ path, outcome string }

func soakPrintByPath(tw *tabwriter.Writer, counts map[soakPathKey]int) {
	outcomes := map[string]bool{}
	for k := range counts {
		outcomes[k.outcome] = true
	}
	fmt.Fprintf(tw, "  outcome\tpgx\trun\ttotal\t\n")
	var tp, tr int
	for _, o := range slices.Sorted(maps.Keys(outcomes)) {
		p, r := counts[soakPathKey{"pgx", o}], counts[soakPathKey{"run", o}]
		tp, tr = tp+p, tr+r
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t\n", o, p, r, p+r)
	}
	fmt.Fprintf(tw, "  total\t%d\t%d\t%d\t\n", tp, tr, tp+tr)
}

func soakResolutionLabel(r reconcile.Answer) string {
	if r.Status() == reconcile.Unknown {
		return "unknown: " + r.Reason()
	}
	return r.Status().String()
}

// soakResolutionContradicts says how a resolution contradicts the table, or "".
func soakResolutionContradicts(r reconcile.Answer, present bool) string {
	switch r.Status() {
	case reconcile.Committed:
		if !present {
			return "resolved committed; the row is absent"
		}
	case reconcile.Aborted, reconcile.NoWrites:
		if present {
			return "resolved " + r.Status().String() + "; the row is present"
		}
	case reconcile.Unknown:
		if r.Reason() == "" {
			return "unresolved without a reason"
		}
	}
	return ""
}

func (o *soakOp) describe() string {
	var parts []string
	parts = append(parts, o.path(), o.via)
	for _, f := range []struct {
		on   bool
		name string
	}{{o.syncRep, "syncrep"}, {o.control == soakCommitCancel, "cancellable"}, {o.control == soakCommitDeadline, "deadline"},
		{o.dup, "dup"}, {o.serial, "serializable"}, {o.appRollback, "app-rollback"}, {o.pause, "pause"},
		{o.postCommitFail, "post-commit-fail"}, {o.participant, "participant"}, {o.marker, "marker"},
		{o.incr, "increment"}, {o.verdict, "verdict"}, {o.ref != "", "ref=" + o.ref}} {
		if f.on {
			parts = append(parts, f.name)
		}
	}
	if o.run {
		parts = append(parts, fmt.Sprintf("calls=%d", o.calls))
		if o.res != nil {
			parts = append(parts, "result="+o.res.Outcome().String())
			switch r := o.res.(type) {
			case outcome.DeterminateRollback[int64]:
				parts = append(parts, fmt.Sprintf("phase=%s cause=%v", r.Phase(), r.Cause()))
			case outcome.Indeterminate[int64]:
				parts = append(parts, fmt.Sprintf("cause=%v", r.Cause()))
			}
		}
	} else if o.incr {
		parts = append(parts, fmt.Sprintf("calls=%d error=%v verdicts=%d", o.calls, o.err, len(o.verdicts)))
	} else {
		if o.failedAt != "" {
			parts = append(parts, "failed at "+o.failedAt+": "+fmt.Sprint(o.err))
		}
		if o.committed {
			parts = append(parts, fmt.Sprintf("Commit error=%v", o.commitErr))
		}
	}
	return strings.Join(parts, " ")
}

// soakIncrCounts are the report's counts of one arm of the increments.
type soakIncrCounts struct {
	ops, calls, applied, double int
	// indeterminate: verdicts Indeterminate; settled: of those, with a reference, the ones
	// reconciliation (in the loop, or else automatic) answered other than unknown.
	indeterminate, withRef, settled int
	noVerdict                       int // Retry calls without a verdict
	notReached                      int // verdicts of transactions that never reached the server
}

// soakIncrArm names an increment's retry loop.
func soakIncrArm(op *soakOp) string {
	if op.verdict {
		return "Retry + verdict + reconcile"
	}
	return "retry on error"
}

// checkIncrement: the counter says how often the increment was applied; soak_incr which
// frames applied it (each checked against its span by framesAgainstRows). With the
// verdict, it is never applied twice, each verdict is its frame's tx.outcome, and each
// indeterminate one with a marker reference is settled by reconciliation.
func (c *soakCheck) checkIncrement(op *soakOp, fs []*soakFrame) {
	if c.incr == nil {
		c.incr = map[string]*soakIncrCounts{}
	}
	arm := soakIncrArm(op)
	k := c.incr[arm]
	if k == nil {
		k = &soakIncrCounts{}
		c.incr[arm] = k
	}
	n := c.counters[op.id]
	k.ops++
	k.calls += op.calls
	k.applied += n
	k.noVerdict += op.noVerdict
	if op.noVerdict > 0 {
		c.fail(op.id, "Retry returned no verdict %d times [%s]", op.noVerdict, op.describe())
	}
	logged := 0
	for _, f := range fs {
		if c.committedBy(op, f.op) {
			logged++
		}
	}
	if logged != n {
		c.fail(op.id, "counter %d, but %d of its frames are in soak_incr [%s]", n, logged, op.describe())
	}
	if n > 1 {
		k.double++
		if op.verdict {
			c.fail(op.id, "applied %d times through Retry with the verdict [%s]", n, op.describe())
		}
	}
	outcomeOf := map[string]string{}
	for _, f := range fs {
		outcomeOf[f.op] = f.outcome
	}
	c.s.autoMu.Lock()
	defer c.s.autoMu.Unlock()
	for _, res := range op.verdicts {
		if rb, ok := res.(outcome.DeterminateRollback[struct{}]); ok && rb.Phase() == outcome.PhaseNotStarted && res.OperationID().IsZero() {
			k.notReached++ // no frame: the pool could not connect
			continue
		}
		id := res.OperationID().String()
		if got := outcomeOf[id]; got != res.Outcome().String() {
			c.fail(op.id, "verdict %s of frame %s, whose span says %q [%s]", res.Outcome(), id, got, op.describe())
		}
		ind, ok := res.(outcome.Indeterminate[struct{}])
		if !ok {
			continue
		}
		k.indeterminate++
		ref, hasRef := ind.Reference()
		if !hasRef {
			continue
		}
		k.withRef++
		settled := false
		for _, a := range op.answers {
			settled = settled || a.Status() != reconcile.Unknown && a.Reference() == ref
		}
		for _, r := range c.s.auto[id] {
			settled = settled || r.Answer.Status() != reconcile.Unknown
		}
		if settled {
			k.settled++
		} else if ref.HasMarker() {
			c.fail(op.id, "indeterminate verdict of frame %s, with a marker reference, never settled [%s]", id, op.describe())
		}
	}
}

// checkPlain: the plain caller's own view must agree with the span.
func (c *soakCheck) checkPlain(op *soakOp, fs []*soakFrame, present bool) {
	if len(fs) > 1 {
		c.fail(op.id, "plain pgx operation has %d frames, want at most one [%s]", len(fs), op.describe())
		return
	}
	if len(fs) == 0 {
		if op.failedAt != "begin" {
			c.fail(op.id, "plain pgx transaction began but has no frame span [%s]", op.describe())
		}
		if present {
			c.fail(op.id, "no transaction began, yet row is present [%s]", op.describe())
		}
		return
	}
	f := fs[0]
	switch {
	case op.committed && op.commitErr == nil && f.outcome != "committed":
		c.fail(op.id, "Commit returned nil; the span says %s [%s]", f.outcome, op.describe())
	case f.outcome == "committed" && (!op.committed || op.commitErr != nil):
		c.fail(op.id, "the span says committed; the caller's Commit said %v [%s]", op.commitErr, op.describe())
	case f.outcome == "indeterminate" && !op.committed:
		c.fail(op.id, "the span says indeterminate, but COMMIT was never sent [%s]", op.describe())
	}
}

// checkRun: the returned result agrees with its frame span and with the table.
func (c *soakCheck) checkRun(op *soakOp, fs []*soakFrame, present bool, row string) {
	res := op.res
	if res == nil {
		c.fail(op.id, "Run returned no result")
		return
	}
	id := res.OperationID()
	if len(fs) == 0 {
		if !soakNotStarted(res) {
			c.fail(op.id, "Run result %s has no frame span [%s]", res.Outcome(), op.describe())
		}
	} else {
		last := fs[len(fs)-1]
		if last.outcome != res.Outcome().String() {
			c.fail(op.id, "Run returned %s; its frame span says %s [%s]", res.Outcome(), last.outcome, op.describe())
		}
		if !id.IsZero() && last.op != id.String() {
			c.fail(op.id, "Run result names operation %s; the last frame span is %s", id, last.op)
		}
		for _, f := range fs[:len(fs)-1] {
			if f.outcome != "rolled_back" {
				c.fail(op.id, "an attempt that was retried ended %s [%s]", f.outcome, op.describe())
			}
		}
	}
	switch res.Outcome() {
	case outcome.OutcomeCommitted, outcome.OutcomeCommittedWithPostCommitFailure:
		if !present && len(fs) > 0 && c.s.lostInFailover(fs[len(fs)-1]) {
			break // counted with its frame
		}
		if !present || row != id.String() {
			c.fail(op.id, "Run returned %s; row present %v (named %q) [%s]", res.Outcome(), present, row, op.describe())
		}
		if res.Outcome() == outcome.OutcomeCommittedWithPostCommitFailure && !op.postCommitFail {
			c.fail(op.id, "committed_with_post_commit_failure without a failing hook")
		}
	case outcome.OutcomeRolledBack:
		if present {
			c.fail(op.id, "Run returned rolled_back; the row is present (committed by %s) [%s]", row, op.describe())
		}
	case outcome.OutcomeIndeterminate:
		if ind := res.(outcome.Indeterminate[int64]); ind.TraceParent() == "" {
			c.fail(op.id, "indeterminate Run result without a traceparent")
		}
	default:
		c.fail(op.id, "Run returned %s", res.Outcome())
	}
	if op.participant && op.inner != nil {
		switch op.inner.Outcome() {
		case outcome.OutcomeParticipating, outcome.OutcomeRolledBack:
		default:
			c.fail(op.id, "the participant claims %s", op.inner.Outcome())
		}
		innerRow, innerPresent := c.rows[op.id+soakParticipantOffset]
		if innerPresent != present || innerPresent && innerRow != row {
			c.fail(op.id, "participant's row present %v (%q), owner's %v (%q): one transaction, two fates", innerPresent, innerRow, present, row)
		}
	}
}
