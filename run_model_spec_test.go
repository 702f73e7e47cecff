package otelpgxtx

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/outcome"
)

// mPool names one of the pools a tree runs on, all on the test server.
type mPool uint8

const (
	poolA mPool = iota // instrumented, 3 connections
	poolB              // instrumented, 1 connection: RequiresNew on it needs it free
	poolU              // uninstrumented, a role without EXECUTE on pg_control_system()
	poolP              // instrumented, 2 connections through a proxy that can cut one after COMMIT
)

var (
	mPoolNames    = [...]string{poolA: "A", poolB: "B", poolU: "U", poolP: "P"}
	mPoolMaxConns = [...]int32{poolA: 3, poolB: 1, poolU: 2, poolP: 2}
)

func (p mPool) instrumented() bool { return p != poolU }

type mStepKind uint8

const (
	stepInsert mStepKind = iota // insert the row id
	stepCall                    // run the child call
	stepHook                    // register an AfterCommit hook named id
	stepEscape                  // keep a handle for use after the tree's Run returned
)

type mHook uint8

const (
	hookOK mHook = iota
	hookErr
	hookPanic
)

type mEscape uint8

const (
	escapeTx           mEscape = iota // the tx given to fn
	escapeSavepoint                   // tx.Begin, a row inserted in it, left open
	escapeLargeObjects                // tx.LargeObjects()
)

var (
	mHookNames   = [...]string{hookOK: "succeeds", hookErr: "fails", hookPanic: "panics"}
	mEscapeNames = [...]string{escapeTx: "tx", escapeSavepoint: "savepoint", escapeLargeObjects: "large objects"}
)

type mStep struct {
	kind   mStepKind
	id     string // row or hook id; for escapeSavepoint, the row inserted in the savepoint
	call   *mCall
	hook   mHook
	escape mEscape
}

// mEnd is how fn ends after its steps.
type mEnd uint8

const (
	endNil    mEnd = iota // return nil
	endErr                // return the call's own error
	endPanic              // panic
	endCancel             // cancel the call's context, then a statement fails: return its error
)

var mEndNames = [...]string{endNil: "return nil", endErr: "return an error", endPanic: "panic", endCancel: "cancel the context, insert, return its error"}

// mCall is one Run call: its policy, its pool, and what its fn does.
type mCall struct {
	path     string // "0", "0.2", "0.2.1": the position in the tree
	prop     Propagation
	pool     mPool
	withRef  bool
	iso      pgx.TxIsoLevel
	attempts int
	steps    []mStep
	end      mEnd
	err      error // what fn returns for endErr
	cut      bool  // an owner on P whose connection is cut once its COMMIT reached the server
}

func (c *mCall) policy() Policy {
	p := DefaultPolicy()
	p.Propagation, p.IsoLevel, p.CommitReference, p.MaxAttempts = c.prop, c.iso, c.withRef, c.attempts
	return p
}

// cancelRow is the row fn tries to insert after cancelling its context.
func (c *mCall) cancelRow() string { return c.path + "/after-cancel" }

func (c *mCall) String() string {
	var b strings.Builder
	c.write(&b, "")
	return b.String()
}

func (c *mCall) write(b *strings.Builder, indent string) {
	iso := string(c.iso)
	if iso == "" {
		iso = "default isolation"
	}
	refs := "references"
	if !c.withRef {
		refs = "no references"
	}
	fmt.Fprintf(b, "%s%s: %s on %s (%s, %s, %d attempt(s))\n", indent, c.path, c.prop, mPoolNames[c.pool], refs, iso, c.attempts)
	for _, s := range c.steps {
		switch s.kind {
		case stepInsert:
			fmt.Fprintf(b, "%s  insert %s\n", indent, s.id)
		case stepCall:
			s.call.write(b, indent+"  ")
		case stepHook:
			fmt.Fprintf(b, "%s  AfterCommit %s (%s)\n", indent, s.id, mHookNames[s.hook])
		case stepEscape:
			fmt.Fprintf(b, "%s  escape the %s", indent, mEscapeNames[s.escape])
			if s.escape == escapeSavepoint {
				fmt.Fprintf(b, " (insert %s in it)", s.id)
			}
			b.WriteString("\n")
		}
	}
	fmt.Fprintf(b, "%s  %s", indent, mEndNames[c.end])
	if c.cut {
		b.WriteString(", and the connection is cut after COMMIT")
	}
	b.WriteString("\n")
}

// walk calls fn for c and every call under it, depth first in execution order.
func (c *mCall) walk(fn func(*mCall)) {
	fn(c)
	for _, s := range c.steps {
		if s.kind == stepCall {
			s.call.walk(fn)
		}
	}
}

// Features a run can leave out (OTELPGXTX_MODEL_EXCLUDE), to look past a known bug.
const (
	featUninstrumented  = "uninstrumented"          // pool U
	featNestedCancel    = "nested_cancel"           // a Nested call cancelling its context
	featRequiresNewPool = "requires_new_other_pool" // RequiresNew on another pool than its caller's transaction
	featEscape          = "escape"                  // handles kept after Run
	featCut             = "cut"                     // a connection cut after COMMIT
)

var mFeatures = []string{featUninstrumented, featNestedCancel, featRequiresNewPool, featEscape, featCut}

// mGen draws trees.
type mGen struct {
	rng     *rand.Rand
	exclude map[string]bool
	calls   int // calls left for this tree
}

// tree draws a tree of at most 10 calls and depth 4.
func (g *mGen) tree() *mCall {
	g.calls = 10
	return g.call("0", 0, poolA)
}

var (
	mProps = []Propagation{Required, Required, RequiresNew, RequiresNew, Nested, Nested, Mandatory}
	mIsos  = []pgx.TxIsoLevel{"", pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}
)

// call draws a call at depth under a transaction on ownerPool (when depth > 0).
func (g *mGen) call(path string, depth int, ownerPool mPool) *mCall {
	g.calls--
	c := &mCall{path: path, prop: mProps[g.rng.IntN(len(mProps))], withRef: g.rng.IntN(4) > 0,
		iso: mIsos[g.rng.IntN(len(mIsos))], attempts: 1 + 2*g.rng.IntN(2), err: fmt.Errorf("fn of %s fails", path)}
	pools := []mPool{poolA, poolA, poolB, poolP}
	if !g.exclude[featUninstrumented] {
		pools = append(pools, poolU)
	}
	c.pool = pools[g.rng.IntN(len(pools))]
	if depth > 0 && c.prop == RequiresNew && g.exclude[featRequiresNewPool] {
		c.pool = ownerPool
	}
	owner := depth == 0 && c.prop != Mandatory || c.prop == RequiresNew
	if owner {
		ownerPool = c.pool
	}
	c.steps = append(c.steps, mStep{kind: stepInsert, id: path + "/r0"})
	for i := 1; i < 1+g.rng.IntN(6); i++ {
		id := fmt.Sprintf("%s/%d", path, i)
		switch r := g.rng.IntN(100); {
		case r < 40 && depth < 4 && g.calls > 0:
			c.steps = append(c.steps, mStep{kind: stepCall, call: g.call(fmt.Sprintf("%s.%d", path, i), depth+1, ownerPool)})
		case r < 60:
			c.steps = append(c.steps, mStep{kind: stepInsert, id: id})
		case r < 80:
			c.steps = append(c.steps, mStep{kind: stepHook, id: id, hook: []mHook{hookOK, hookOK, hookErr, hookPanic}[g.rng.IntN(4)]})
		case !g.exclude[featEscape]:
			c.steps = append(c.steps, mStep{kind: stepEscape, id: id, escape: mEscape(g.rng.IntN(3))})
		}
	}
	ends := []mEnd{endNil, endNil, endNil, endNil, endNil, endNil, endNil, endErr, endCancel, endCancel}
	if g.rng.IntN(20) == 0 {
		c.end = endPanic
	} else {
		c.end = ends[g.rng.IntN(len(ends))]
	}
	if depth > 0 && c.prop == Nested {
		// Undoing a savepoint whose context has ended is the delicate part: draw it more often.
		if c.end == endNil && g.rng.IntN(3) == 0 {
			c.end = endCancel
		}
		if c.end == endCancel && g.exclude[featNestedCancel] {
			c.end = endErr
		}
	}
	c.cut = owner && c.pool == poolP && c.end == endNil && !g.exclude[featCut] && g.rng.IntN(2) == 0
	return c
}

// The model.

// mCause is what a rollback's cause must wrap.
type mCause struct {
	invalid bool   // ErrInvalidArgument
	of      *mCall // otherwise the failure of this call's fn: its own error, or context.Canceled
}

// mResult is what one call must do.
type mResult struct {
	ran     bool // fn ran, exactly once
	panics  bool // Run panicked (again)
	outcome outcome.Outcome
	phase   outcome.Phase // of a rollback
	cause   mCause        // of a rollback
	owner   *mCall        // the call whose transaction the result names (nil: none)
}

// mFrame is what the frame span of an owner on an instrumented pool must say.
type mFrame struct {
	call         *mCall
	outcome      outcome.Outcome
	depth        int
	parent       *mCall   // the frame whose span is the parent; nil: the tree's root span
	participants []string // tx.participant events in order, "propagation:outcome"
	suspended    int      // frames begun while this one was suspended
	hooks        bool     // a tx.post_commit span is expected
	hookFailed   bool     // ... with status Error
}

// mWant is the model's verdict on a whole tree.
type mWant struct {
	results map[*mCall]*mResult // absent: the call never ran (a panic unwound past it)
	rows    map[string]bool     // every row the tree names; true: committed
	maybe   map[string]*mCall   // rows of an owner whose commit cannot be known: all or none
	hooks   map[string]bool     // every hook registered; true: runs exactly once
	frames  []*mFrame
}

type mOwner struct {
	call  *mCall
	frame *mFrame
	doom  *mCause // the first participant failure: the owner must roll back
}

// mScope is a transaction as fn sees it: an owner's, or a Nested call's savepoint.
type mScope struct {
	owner *mOwner
	rows  []string
	hooks []mStep
}

// model computes what running tree must do. The rules:
//
//   - Mandatory without a transaction of Run in ctx is refused: a rollback in not_started
//     wrapping ErrInvalidArgument; fn never runs.
//   - Required or Mandatory with one joins it, whatever its pool: Participating when fn
//     returns nil; otherwise a rollback wrapping fn's error, which dooms the owner.
//   - Nested with one runs in a savepoint: Participating when fn returns nil, and its rows
//     and hooks become the enclosing scope's; otherwise (a context cancelled mid-call
//     too) a rollback of the savepoint alone, which never dooms the owner.
//   - RequiresNew with one is refused only when the owners suspended in this call chain
//     hold every connection of its own pool; otherwise it is an owner.
//   - An owner commits when fn returns nil and no participant failed: Committed, or
//     CommittedWithPostCommitFailure if a hook fails; every hook of its committed scopes
//     runs once. Otherwise it rolls back in active, wrapping fn's error or else the first
//     failed participant's, and its hooks never run. Never Indeterminate (Run's own
//     statements never abort a transaction), except when the connection is cut after
//     COMMIT reached the server: then all or none of its rows are committed, and its
//     hooks never run.
//   - A panic rolls back every transaction it unwinds through and reaches the caller.
//   - A handle kept after Run fails every use with pgx.ErrTxClosed and writes nothing.
//   - An owner on an instrumented pool has a frame span: its depth is the number of
//     instrumented owners suspended above it, its parent the innermost one's span (or the
//     caller's), and each participant is a tx.participant event on it.
func model(tree *mCall) *mWant {
	w := &mWant{results: map[*mCall]*mResult{}, rows: map[string]bool{}, maybe: map[string]*mCall{}, hooks: map[string]bool{}}
	tree.walk(func(c *mCall) {
		for _, s := range c.steps {
			switch {
			case s.kind == stepInsert || s.kind == stepEscape && s.escape == escapeSavepoint:
				w.rows[s.id] = false
			case s.kind == stepHook:
				w.hooks[s.id] = false
			}
		}
		if c.end == endCancel {
			w.rows[c.cancelRow()] = false
		}
	})
	w.run(tree, nil, nil)
	return w
}

// run models c called in a context carrying sc (nil: none) under the suspended owners
// in chain, and reports whether a panic leaves it.
func (w *mWant) run(c *mCall, sc *mScope, chain []*mOwner) (panics bool) {
	r := &mResult{}
	w.results[c] = r
	invalid := func() {
		r.outcome, r.phase, r.cause = outcome.OutcomeRolledBack, outcome.PhaseNotStarted, mCause{invalid: true}
	}
	switch {
	case sc == nil && c.prop == Mandatory:
		invalid()
		return false
	case sc != nil && (c.prop == Required || c.prop == Mandatory):
		// Joins the transaction in ctx, whatever its pool: a failure dooms the owner.
		r.owner = sc.owner.call
		ok, panics := w.body(c, r, sc, chain)
		if panics {
			return true
		}
		if !ok && sc.owner.doom == nil {
			sc.owner.doom = &mCause{of: c}
		}
		w.participated(c, r, sc, ok)
		return false
	case sc != nil && c.prop == Nested:
		// A savepoint: a failure undoes it alone, whatever its context did.
		r.owner = sc.owner.call
		sp := &mScope{owner: sc.owner}
		ok, panics := w.body(c, r, sp, chain)
		if panics {
			return true
		}
		if ok {
			sc.rows, sc.hooks = append(sc.rows, sp.rows...), append(sc.hooks, sp.hooks...)
		}
		w.participated(c, r, sc, ok)
		return false
	case sc != nil && c.prop == RequiresNew:
		// Refused only when every connection of its own pool is held by this chain.
		held := 0
		for _, o := range chain {
			if o.call.pool == c.pool {
				held++
			}
		}
		if held >= int(mPoolMaxConns[c.pool]) {
			invalid()
			return false
		}
	}
	// An owner: a physical transaction of its own.
	o := &mOwner{call: c}
	r.owner = c
	if c.pool.instrumented() {
		o.frame = &mFrame{call: c}
		var parent *mOwner // the innermost instrumented owner: its frame is suspended
		for _, s := range chain {
			if s.frame != nil {
				o.frame.depth++
				parent = s
			}
		}
		if parent != nil {
			o.frame.parent = parent.call
			parent.frame.suspended++
		}
		w.frames = append(w.frames, o.frame)
	}
	own := &mScope{owner: o}
	ok, panics := w.body(c, r, own, append(slices.Clip(chain), o))
	switch {
	case panics:
		if o.frame != nil {
			o.frame.outcome = outcome.OutcomeRolledBack
		}
		return true
	case ok && o.doom != nil:
		r.outcome, r.phase, r.cause = outcome.OutcomeRolledBack, outcome.PhaseActive, *o.doom
	case ok && c.cut:
		// The only fault: the client never learns how its COMMIT ended, and says so.
		r.outcome = outcome.OutcomeIndeterminate
		for _, id := range own.rows {
			w.maybe[id] = c
		}
	case ok:
		r.outcome = outcome.OutcomeCommitted
		for _, id := range own.rows {
			w.rows[id] = true
		}
		for _, h := range own.hooks {
			w.hooks[h.id] = true
			if o.frame != nil {
				o.frame.hooks = true
			}
			if h.hook != hookOK {
				r.outcome = outcome.OutcomeCommittedWithPostCommitFailure
				if o.frame != nil {
					o.frame.hookFailed = true
				}
			}
		}
	}
	if o.frame != nil {
		o.frame.outcome = r.outcome
	}
	return false
}

// body models fn of c in scope sc: ok when it returns nil, panics when a panic leaves it.
// A failure sets r to the rollback it causes.
func (w *mWant) body(c *mCall, r *mResult, sc *mScope, chain []*mOwner) (ok, panics bool) {
	r.ran = true
	for _, s := range c.steps {
		switch s.kind {
		case stepInsert:
			sc.rows = append(sc.rows, s.id)
		case stepCall:
			if w.run(s.call, sc, chain) {
				r.panics = true
				return false, true
			}
		case stepHook:
			sc.hooks = append(sc.hooks, s)
		case stepEscape:
			if s.escape == escapeSavepoint {
				sc.rows = append(sc.rows, s.id) // the savepoint stays open: its rows are the call's
			}
		}
	}
	switch c.end {
	case endNil:
		return true, false
	case endPanic:
		r.panics = true
		return false, true
	}
	r.outcome, r.phase, r.cause = outcome.OutcomeRolledBack, outcome.PhaseActive, mCause{of: c}
	return false, false
}

// participated records a participant's outcome: Participating when fn returned nil.
func (w *mWant) participated(c *mCall, r *mResult, sc *mScope, ok bool) {
	if ok {
		r.outcome = outcome.OutcomeParticipating
	}
	if f := sc.owner.frame; f != nil {
		f.participants = append(f.participants, c.prop.String()+":"+r.outcome.String())
	}
}
