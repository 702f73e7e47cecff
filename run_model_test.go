package otelpgxtx

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/pgtest"
)

const (
	modelTable = "otelpgxtx_model_rows"
	// modelRole may not execute pg_control_system(): the identity query fails for it.
	modelRole = "otelpgxtx_model"
)

type modelConfig struct {
	seed    uint64
	trees   int
	exclude map[string]bool
}

// modelConfigFromEnv reads
//
//	OTELPGXTX_MODEL_SEED     seed of the first tree; tree i has seed+i (default: random, logged)
//	OTELPGXTX_MODEL_TREES    trees to run (default 200)
//	OTELPGXTX_MODEL_EXCLUDE  features to leave out, comma-separated (see mFeatures)
func modelConfigFromEnv(t *testing.T) modelConfig {
	t.Helper()
	c := modelConfig{seed: rand.Uint64(), trees: 200, exclude: map[string]bool{}}
	if s := os.Getenv("OTELPGXTX_MODEL_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("OTELPGXTX_MODEL_SEED=%q: want an unsigned integer", s)
		}
		c.seed = n
	}
	if s := os.Getenv("OTELPGXTX_MODEL_TREES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("OTELPGXTX_MODEL_TREES=%q: want a positive integer", s)
		}
		c.trees = n
	}
	if s := os.Getenv("OTELPGXTX_MODEL_EXCLUDE"); s != "" {
		for f := range strings.SplitSeq(s, ",") {
			if !slices.Contains(mFeatures, f) {
				t.Fatalf("OTELPGXTX_MODEL_EXCLUDE: unknown feature %q; known: %v", f, mFeatures)
			}
			c.exclude[f] = true
		}
	}
	return c
}

func TestRunModel(t *testing.T) {
	cfg := modelConfigFromEnv(t)
	restricted := modelSetup(t, pgtest.ContextFor(t))
	// Pools A and B reach the server through a transaction-mode PgBouncer with a server
	// connection for each of their client connections, so that it never makes one wait:
	// every transaction of theirs may run on another server connection than the client's
	// last one, and two clients' transactions take turns on the same one.
	bouncer := pgtest.PgBouncerFor(t, pgtest.ContextFor(t), srv, "transaction", int(mPoolMaxConns[poolA]+mPoolMaxConns[poolB]))
	pooled := bouncer.ConnString() + "&default_query_exec_mode=exec"
	exclude := strings.Join(slices.Sorted(maps.Keys(cfg.exclude)), ",")
	t.Logf("seed %d, %d trees, excluding %q", cfg.seed, cfg.trees, exclude)
	seen := map[string]int{} // what the model expected, over all trees
	defer func() {
		t.Logf("tally over all trees (what the model expected; for cuts, what the table said): %v", seen)
	}()
	for i := range cfg.trees {
		seed := cfg.seed + uint64(i)
		if !t.Run(fmt.Sprintf("tree%d", i), func(t *testing.T) { runModelTree(t, i, seed, cfg.exclude, pooled, restricted, seen) }) {
			t.Fatalf("tree %d diverged; replay it alone with OTELPGXTX_MODEL_SEED=%d OTELPGXTX_MODEL_TREES=1 OTELPGXTX_MODEL_EXCLUDE=%q",
				i, seed, exclude)
		}
	}
}

// modelSetup creates the rows table and the restricted role (see revokeIdentity), and
// returns the role's connection string.
func modelSetup(t *testing.T, ctx context.Context) string {
	t.Helper()
	err := srv.Exec(ctx, `drop table if exists `+modelTable+`;
create table `+modelTable+` (tree int, id text, primary key (tree, id));
do $$ begin
	if not exists (select from pg_roles where rolname = '`+modelRole+`') then
		create role `+modelRole+` login;
	end if;
end $$;
grant select, insert on `+modelTable+` to `+modelRole)
	if err != nil {
		t.Fatal(err)
	}
	revokeIdentity(t, ctx)
	connString := strings.Replace(srv.ConnString(), "postgres@", modelRole+"@", 1)
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var pgErr *pgconn.PgError
	if _, err := conn.Exec(ctx, "select pg_control_system()"); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("the restricted role can run pg_control_system(): %v", err)
	}
	return connString
}

// mGot is what one call did.
type mGot struct {
	calls    int          // fn invocations
	span     trace.SpanID // the span in fn's context: the frame's, for an instrumented owner
	res      outcome.Result[string]
	returned bool
	panicked bool
}

// mKept is a handle kept after fn returned.
type mKept struct {
	call *mCall
	step mStep
	tx   pgx.Tx // escapeTx, escapeSavepoint
	lo   pgx.LargeObjects
}

// mDriver runs one tree.
type mDriver struct {
	tree  int
	pools [4]*pgxpool.Pool
	proxy *pgtest.Proxy // in front of pool P
	cuts  int64         // the proxy's cuts when a cut was armed; -1: none armed
	got   map[*mCall]*mGot
	hooks map[string]int // runs per hook id
	kept  []mKept
	notes []string // divergences seen while running
}

func (d *mDriver) note(format string, args ...any) {
	d.notes = append(d.notes, fmt.Sprintf(format, args...))
}

func runModelTree(t *testing.T, n int, seed uint64, exclude map[string]bool, pooled, restricted string, seen map[string]int) {
	tree := (&mGen{rng: rand.New(rand.NewPCG(seed, 0)), exclude: exclude}).tree()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d, tree:\n%s", seed, tree)
		}
	})
	want := model(tree)
	for c, r := range want.results {
		kind := r.outcome.String()
		switch {
		case r.panics:
			kind = "panics"
		case r.cause.invalid:
			kind = "invalid"
		}
		seen[c.prop.String()+" "+kind]++
	}
	for _, f := range want.frames {
		seen[fmt.Sprintf("frame depth %d %s", f.depth, f.outcome)]++
	}

	ctx := pgtest.ContextFor(t)
	hA := newHarness(t, pooled, mPoolMaxConns[poolA])
	hB := newHarness(t, pooled, mPoolMaxConns[poolB])
	proxy := pgtest.ProxyFor(t, srv)
	hP := newHarness(t, proxy.ConnString(srv.ConnString()), mPoolMaxConns[poolP])
	cfg, err := pgxpool.ParseConfig(restricted)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = mPoolMaxConns[poolU]
	u, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.Close)
	d := &mDriver{tree: n, pools: [...]*pgxpool.Pool{poolA: hA.pool, poolB: hB.pool, poolU: u, poolP: hP.pool},
		proxy: proxy, cuts: -1, got: map[*mCall]*mGot{}, hooks: map[string]int{}}

	rctx, root := rootSpan(ctx, hA)
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		d.call(rctx, tree)
	}()
	root.End()
	d.useKept(ctx)

	var divs []string
	var wantPanic any // the panic of the call that panicked, passed on by every Run above it
	tree.walk(func(c *mCall) {
		if r := want.results[c]; r != nil && r.ran && c.end == endPanic {
			wantPanic = "panic in " + c.path
		}
	})
	if recovered != wantPanic {
		divs = append(divs, fmt.Sprintf("the tree's Run panicked with %v; model: %v", recovered, wantPanic))
	}
	divs = append(divs, d.compareResults(tree, want)...)
	rowDivs, unknown := d.compareRows(t, ctx, want)
	divs = append(divs, rowDivs...)
	for committed, n := range unknown {
		seen[fmt.Sprintf("cut after COMMIT, committed %v", committed)] += n
	}
	divs = append(divs, d.compareHooks(want)...)
	divs = append(divs, d.compareFrames(want, root, hA, hB, hP)...)
	divs = append(divs, d.notes...)
	if len(divs) > 0 {
		t.Fatalf("first divergence: %s\nall %d:\n  %s", divs[0], len(divs), strings.Join(divs, "\n  "))
	}
	for _, h := range []*harness{hA, hB, hP} {
		h.wantNoFrames(t, ctx)
	}
}

// call runs c; a panic leaves it as Run re-panics it.
func (d *mDriver) call(ctx context.Context, c *mCall) {
	g := &mGot{}
	d.got[c] = g
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer func() { g.panicked = !g.returned }()
	g.res = Run(ctx, d.pools[c.pool], c.policy(), func(ctx context.Context, tx pgx.Tx) (string, error) {
		g.calls++
		g.span = trace.SpanFromContext(ctx).SpanContext().SpanID()
		return c.path, d.body(ctx, cancel, c, tx)
	})
	g.returned = true
	if d.cuts >= 0 && d.proxy.Cuts() == d.cuts {
		// Run sent no COMMIT (a participant had failed): consume the armed cut here, where
		// it cannot hit another call's COMMIT.
		if conn, err := pgx.Connect(ctx, d.proxy.ConnString(srv.ConnString())); err == nil {
			_, _ = conn.Exec(ctx, "commit")
			_ = conn.Close(ctx)
		}
		if d.proxy.Cuts() == d.cuts {
			d.note("call %s: the armed cut was never used", c.path)
		}
	}
	d.cuts = -1
}

func (d *mDriver) insert(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, "insert into "+modelTable+" (tree, id) values ($1, $2)", d.tree, id)
	return err
}

// body is fn of c.
func (d *mDriver) body(ctx context.Context, cancel context.CancelFunc, c *mCall, tx pgx.Tx) error {
	for _, s := range c.steps {
		switch s.kind {
		case stepInsert:
			if err := d.insert(ctx, tx, s.id); err != nil {
				d.note("call %s: insert %s: %v", c.path, s.id, err)
				return err
			}
		case stepCall:
			d.call(ctx, s.call)
		case stepHook:
			if err := AfterCommit(ctx, d.hook(s)); err != nil {
				d.note("call %s: AfterCommit: %v", c.path, err)
			}
		case stepEscape:
			k := mKept{call: c, step: s}
			switch s.escape {
			case escapeTx:
				k.tx = tx
			case escapeSavepoint:
				sp, err := tx.Begin(ctx)
				if err == nil {
					err = d.insert(ctx, sp, s.id)
				}
				if err != nil {
					d.note("call %s: a savepoint and insert %s: %v", c.path, s.id, err)
					return err
				}
				k.tx = sp
			case escapeLargeObjects:
				k.lo = tx.LargeObjects()
			}
			d.kept = append(d.kept, k)
		}
	}
	switch c.end {
	case endErr:
		return c.err
	case endPanic:
		panic("panic in " + c.path)
	case endNil:
		if c.cut {
			d.cuts = d.proxy.Cuts()
			d.proxy.CutAfterCommit()
		}
	case endCancel:
		cancel()
		err := d.insert(ctx, tx, c.cancelRow())
		if !errors.Is(err, context.Canceled) {
			d.note("call %s: insert after cancel: %v, want context.Canceled", c.path, err)
			if err == nil {
				err = errors.New("no error")
			}
		}
		return fmt.Errorf("%s: insert after cancel: %w", c.path, err)
	}
	return nil
}

func (d *mDriver) hook(s mStep) func(context.Context) error {
	return func(context.Context) error {
		d.hooks[s.id]++
		switch s.hook {
		case hookErr:
			return fmt.Errorf("hook %s fails", s.id)
		case hookPanic:
			panic("hook " + s.id + " panics")
		}
		return nil
	}
}

// useKept uses every kept handle, after the tree's Run returned: each use must fail
// with pgx.ErrTxClosed, and write nothing (the rows named …/late-… must not exist).
func (d *mDriver) useKept(ctx context.Context) {
	for _, k := range d.kept {
		what := fmt.Sprintf("%s kept by call %s at %s", mEscapeNames[k.step.escape], k.call.path, k.step.id)
		want := func(op string, err error) {
			if !errors.Is(err, pgx.ErrTxClosed) {
				d.note("%s: %s after Run = %v, want pgx.ErrTxClosed", what, op, err)
			}
		}
		late := func(op string) string { return k.step.id + "/late-" + op }
		if k.step.escape == escapeLargeObjects {
			_, err := k.lo.Create(ctx, 0)
			want("Create", err)
			continue
		}
		tx := k.tx
		want("Exec", d.insert(ctx, tx, late("exec")))
		rows, err := tx.Query(ctx, "select 1")
		if rows != nil {
			rows.Close()
		}
		want("Query", err)
		var one int
		want("QueryRow", tx.QueryRow(ctx, "select 1").Scan(&one))
		b := &pgx.Batch{}
		b.Queue("insert into "+modelTable+" (tree, id) values ($1, $2)", d.tree, late("batch"))
		br := tx.SendBatch(ctx, b)
		_, err = br.Exec()
		want("SendBatch", errors.Join(err, br.Close()))
		_, err = tx.CopyFrom(ctx, pgx.Identifier{modelTable}, []string{"tree", "id"}, pgx.CopyFromRows([][]any{{d.tree, late("copy")}}))
		want("CopyFrom", err)
		_, err = tx.Prepare(ctx, "", "select 1")
		want("Prepare", err)
		_, err = tx.Begin(ctx)
		want("Begin", err)
		lo := tx.LargeObjects()
		_, err = lo.Create(ctx, 0)
		want("LargeObjects().Create", err)
		if k.step.escape == escapeSavepoint {
			want("Commit", tx.Commit(ctx))
			want("Rollback", tx.Rollback(ctx))
		}
	}
}

// label names a call in a divergence.
func label(c *mCall) string {
	return fmt.Sprintf("call %s (%s on %s)", c.path, c.prop, mPoolNames[c.pool])
}

func describe(r outcome.Result[string]) string {
	switch r := r.(type) {
	case outcome.DeterminateRollback[string]:
		return fmt.Sprintf("rolled_back in %s (%v)", r.Phase(), r.Cause())
	case outcome.Indeterminate[string]:
		return fmt.Sprintf("indeterminate (%v)", r.Cause())
	case outcome.CommittedWithPostCommitFailure[string]:
		return fmt.Sprintf("committed_with_post_commit_failure (%v)", r.Failure())
	}
	return r.Outcome().String()
}

func (m *mResult) String() string {
	if m.panics {
		return "panics"
	}
	if m.outcome != outcome.OutcomeRolledBack {
		return m.outcome.String()
	}
	cause := "ErrInvalidArgument"
	switch {
	case m.cause.invalid:
	case m.cause.of.end == endCancel:
		cause = "context.Canceled from " + m.cause.of.path
	default:
		cause = fmt.Sprintf("%q", m.cause.of.err)
	}
	return fmt.Sprintf("rolled_back in %s wrapping %s", m.phase, cause)
}

func (d *mDriver) compareResults(tree *mCall, want *mWant) []string {
	var divs []string
	tree.walk(func(c *mCall) {
		m, g := want.results[c], d.got[c]
		switch {
		case m == nil && g == nil:
			return
		case m == nil:
			divs = append(divs, label(c)+" ran; the model says a panic unwound past it")
			return
		case g == nil:
			divs = append(divs, fmt.Sprintf("%s never ran; model: %s", label(c), m))
			return
		}
		if want := map[bool]int{true: 1}[m.ran]; g.calls != want {
			divs = append(divs, fmt.Sprintf("%s: fn ran %d times; model: %d", label(c), g.calls, want))
		}
		if g.panicked || m.panics {
			if g.panicked != m.panics {
				got := "panicked"
				if g.res != nil {
					got = describe(g.res)
				}
				divs = append(divs, fmt.Sprintf("%s: %s; model: %s", label(c), got, m))
			}
			return
		}
		if d := compareResult(c, g, m, want, d.got); d != "" {
			divs = append(divs, fmt.Sprintf("%s: %s; model: %s", label(c), d, m))
		}
	})
	return divs
}

// compareResult returns what is wrong with one returned result, or "".
func compareResult(c *mCall, g *mGot, m *mResult, want *mWant, got map[*mCall]*mGot) string {
	r := g.res
	if r.Outcome() != m.outcome {
		return describe(r)
	}
	if rb, ok := r.(outcome.DeterminateRollback[string]); ok {
		cause := rb.Cause()
		var causeOK bool
		switch {
		case m.cause.invalid:
			causeOK = errors.Is(cause, ErrInvalidArgument)
		case m.cause.of.end == endCancel:
			causeOK = errors.Is(cause, context.Canceled) && strings.HasPrefix(cause.Error(), m.cause.of.path+": ")
		default:
			causeOK = errors.Is(cause, m.cause.of.err)
		}
		if !causeOK || rb.Phase() != m.phase {
			return describe(r)
		}
	} else if v, ok := valueOf(r); ok && v != c.path {
		return fmt.Sprintf("%s with value %q", describe(r), v)
	}
	id := r.OperationID()
	switch {
	case m.owner == nil:
		if !id.IsZero() {
			return fmt.Sprintf("%s with operation id %v", describe(r), id)
		}
	case m.owner != c:
		if og := got[m.owner]; og != nil && og.res != nil && og.res.OperationID() != id {
			return fmt.Sprintf("%s naming operation %v, not its owner's %v", describe(r), id, og.res.OperationID())
		}
	}
	return ""
}

// valueOf returns the value of a result that has one.
func valueOf(r outcome.Result[string]) (string, bool) {
	switch r := r.(type) {
	case outcome.Committed[string]:
		return r.Value(), true
	case outcome.Participating[string]:
		return r.Value(), true
	case outcome.CommittedWithPostCommitFailure[string]:
		return r.Value(), true
	}
	return "", false
}

// compareRows compares the table with the model, and counts the owners whose commit
// was unknown by what the table says of them.
func (d *mDriver) compareRows(t *testing.T, ctx context.Context, want *mWant) (divs []string, unknown map[bool]int) {
	t.Helper()
	conn, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "select id from "+modelTable+" where tree = $1 order by id", d.tree)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	present := map[*mCall]int{} // per owner whose commit is unknown, its rows in the table
	for _, id := range ids {
		if o := want.maybe[id]; o != nil {
			present[o]++
			continue
		}
		if committed, known := want.rows[id]; !known {
			divs = append(divs, fmt.Sprintf("row %s (written through a kept handle) is in the table", id))
		} else if !committed {
			divs = append(divs, fmt.Sprintf("row %s is in the table; model: never committed", id))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(want.rows)) {
		if want.rows[id] && !slices.Contains(ids, id) {
			divs = append(divs, fmt.Sprintf("row %s is not in the table; model: committed", id))
		}
	}
	total := map[*mCall]int{}
	for _, o := range want.maybe {
		total[o]++
	}
	unknown = map[bool]int{}
	for o, n := range total {
		unknown[present[o] > 0]++
		if p := present[o]; p != 0 && p != n {
			divs = append(divs, fmt.Sprintf("%d of the %d rows of %s are in the table; model: all or none", p, n, label(o)))
		}
	}
	return divs, unknown
}

func (d *mDriver) compareHooks(want *mWant) []string {
	var divs []string
	for _, id := range slices.Sorted(maps.Keys(want.hooks)) {
		if runs, w := d.hooks[id], map[bool]int{true: 1}[want.hooks[id]]; runs != w {
			divs = append(divs, fmt.Sprintf("hook %s ran %d times; model: %d", id, runs, w))
		}
	}
	return divs
}

// compareFrames checks the frame spans of both instrumented pools against the model.
func (d *mDriver) compareFrames(want *mWant, root trace.Span, hs ...*harness) []string {
	var divs []string
	frames := map[trace.SpanID]tracetest.SpanStub{}
	owner := map[trace.SpanID]*harness{}
	for _, h := range hs {
		for _, f := range h.frames() {
			frames[f.SpanContext.SpanID()] = f
			owner[f.SpanContext.SpanID()] = h
		}
		for _, s := range h.exp.GetSpans() {
			if n := h.ends.ends[s.SpanContext.SpanID()]; n != 1 {
				divs = append(divs, fmt.Sprintf("span %q ended %d times", s.Name, n))
			}
		}
	}
	for _, m := range want.frames {
		c, g := m.call, d.got[m.call]
		if g == nil || g.calls == 0 {
			continue // compareResults says why
		}
		f, ok := frames[g.span]
		if !ok {
			divs = append(divs, fmt.Sprintf("%s: no frame span", label(c)))
			continue
		}
		delete(frames, g.span)
		check := func(what string, got, want any) {
			if got != want {
				divs = append(divs, fmt.Sprintf("%s: frame %s = %v; model: %v", label(c), what, got, want))
			}
		}
		str := func(k string) string {
			if v, ok := attr(f, attributeKey(k)); ok {
				return v.String()
			}
			return ""
		}
		check("tx.outcome", str("tx.outcome"), m.outcome.String())
		check("tx.propagation", str("tx.propagation"), c.prop.String())
		check("tx.frame.depth", str("tx.frame.depth"), strconv.Itoa(m.depth))
		check("tx.attempt", str("tx.attempt"), "1")
		check("tx.isolation", str("tx.isolation"), string(c.iso))
		if g.res != nil {
			check("tx.operation_id", str("tx.operation_id"), g.res.OperationID().String())
		}
		parent := root.SpanContext().SpanID()
		if m.parent != nil {
			parent = d.got[m.parent].span
		}
		check("parent", f.Parent.SpanID(), parent)
		var participants []string
		var suspended, resumed int
		for _, e := range f.Events {
			switch e.Name {
			case schema.EventParticipant:
				var prop, out string
				for _, kv := range e.Attributes {
					switch kv.Key {
					case PropagationKey:
						prop = kv.Value.String()
					case schema.ParticipantOutcomeKey:
						out = kv.Value.String()
					}
				}
				participants = append(participants, prop+":"+out)
			case schema.EventSuspended:
				suspended++
			case schema.EventResumed:
				resumed++
			}
		}
		check("participant events", fmt.Sprint(participants), fmt.Sprint(m.participants))
		check("tx.suspended events", suspended, m.suspended)
		check("tx.resumed events", resumed, m.suspended)
		var post []codes.Code
		for _, s := range owner[f.SpanContext.SpanID()].children(f) {
			if s.Name == schema.SpanNamePostCommit {
				post = append(post, s.Status.Code)
			}
		}
		var wantPost []codes.Code
		if m.hooks {
			wantPost = append(wantPost, map[bool]codes.Code{true: codes.Error}[m.hookFailed])
		}
		check("tx.post_commit spans", fmt.Sprint(post), fmt.Sprint(wantPost))
	}
	for _, f := range frames {
		divs = append(divs, fmt.Sprintf("a frame span the model does not have: %v", names([]tracetest.SpanStub{f})))
	}
	return divs
}
