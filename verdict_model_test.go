package otelpgxtx

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"testing"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/internal/record"
	"github.com/txevidence/otelpgxtx/outcome"
)

// TestVerdictAttemptModel: a Verdict told of the transactions of one attempt — frames
// begun and ended with its context, frames only ended with it, a failed Acquire —
// answers what a model of the attempt says, for random sequences: Indeterminate if any
// transaction's commit is unknown; else CommittedWithPostCommitFailure when a rollback
// (or a failed Acquire) follows a commit; else the last transaction's own answer, a
// rollback retryable only as the last one is. Settling is offered only for exactly one
// unknown. Each sequence is replayed alone by OTELPGXTX_VERDICT_SEED.
func TestVerdictAttemptModel(t *testing.T) {
	seed := testSeed(t, "OTELPGXTX_VERDICT_SEED")
	seen := map[outcome.Outcome]int{}
	for i := range 2000 {
		s := seed + uint64(i)
		got, want, trace := verdictSequence(s)
		if got != want {
			t.Fatalf("seed %d: %s\n  verdict %s, model %s", s, trace, got, want)
		}
		seen[want.outcome]++
	}
	for _, o := range outcome.Outcomes() {
		if o != outcome.OutcomeParticipating && seen[o] == 0 {
			t.Errorf("no sequence ended %s: the generator misses it (%v)", o, seen)
		}
	}
	t.Logf("answers: %v", seen)
}

// modelAnswer is what the model and the Verdict are compared on.
type modelAnswer struct {
	outcome    outcome.Outcome
	retryable  bool
	id         outcome.OperationID
	settleable bool
	noVerdict  bool
}

func (a modelAnswer) String() string {
	if a.noVerdict {
		return "no verdict"
	}
	return fmt.Sprintf("%s retryable=%v settleable=%v id=%s", a.outcome, a.retryable, a.settleable, a.id.String()[:6])
}

// verdictSequence plays one random sequence on a Verdict and on the model.
func verdictSequence(seed uint64) (got, want modelAnswer, trace string) {
	r := rand.New(rand.NewPCG(seed, 0))
	v := &Verdict{}
	type ended struct {
		o         outcome.Outcome
		retryable bool
		id        outcome.OperationID
	}
	var done []ended
	open := false
	n := 1 + r.IntN(5)
	for range n {
		switch k := r.IntN(10); {
		case k == 0 && !open:
			v.s.NotStarted(&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")})
			trace += " acquire-failed"
			done = append(done, ended{o: outcome.OutcomeRolledBack, retryable: true})
		default:
			if !open && r.IntN(3) > 0 {
				v.s.Began()
				open = true
				trace += " begin"
			}
			o := []outcome.Outcome{outcome.OutcomeCommitted, outcome.OutcomeRolledBack, outcome.OutcomeIndeterminate,
				outcome.OutcomeCommittedWithPostCommitFailure, outcome.OutcomeParticipating}[r.IntN(5)]
			e := record.Ending{ID: outcome.NewOperationID(), Outcome: o}
			retryable := false
			switch o {
			case outcome.OutcomeRolledBack:
				retryable = r.IntN(2) == 0
				code := "23505"
				if retryable {
					code = "40001"
				}
				e.Verdict, _ = classifier.NewClassification(classifier.EvidenceRolledBack, retryable, code, classifier.ReasonServerError)
				e.EndedIn = outcome.PhaseActive
				e.EndErr = errors.New("failed")
			case outcome.OutcomeIndeterminate:
				e.Verdict, _ = classifier.NewClassification(classifier.EvidenceUnknown, false, "", classifier.ReasonConnectionLost)
				e.EndErr = errors.New("lost")
			case outcome.OutcomeCommittedWithPostCommitFailure:
				e.EndErr = errors.New("scan")
			}
			v.s.FrameEnded(&e)
			open = false
			trace += " " + o.String()
			done = append(done, ended{o: o, retryable: retryable, id: e.ID})
		}
	}
	// The model.
	var unknowns []ended
	committed := false
	for i, d := range done {
		if d.o == outcome.OutcomeIndeterminate {
			unknowns = append(unknowns, d)
		}
		if i < len(done)-1 && (d.o == outcome.OutcomeCommitted || d.o == outcome.OutcomeCommittedWithPostCommitFailure) {
			committed = true
		}
	}
	last := done[len(done)-1]
	switch {
	case len(unknowns) > 0 && last.o == outcome.OutcomeIndeterminate:
		want = modelAnswer{outcome: outcome.OutcomeIndeterminate, id: last.id}
	case len(unknowns) > 0:
		want = modelAnswer{outcome: outcome.OutcomeIndeterminate, id: unknowns[0].id}
	case committed && last.o == outcome.OutcomeRolledBack:
		want = modelAnswer{outcome: outcome.OutcomeCommittedWithPostCommitFailure}
		for _, d := range done[:len(done)-1] {
			if d.o == outcome.OutcomeCommitted || d.o == outcome.OutcomeCommittedWithPostCommitFailure {
				want.id = d.id // the last that committed
			}
		}
	default:
		want = modelAnswer{outcome: last.o, retryable: last.retryable, id: last.id}
	}
	want.settleable = len(unknowns) == 1
	res, err := v.Result()
	if err != nil {
		return modelAnswer{noVerdict: true}, want, trace
	}
	got = modelAnswer{outcome: res.Outcome(), id: res.OperationID()}
	if rb, ok := res.(outcome.DeterminateRollback[struct{}]); ok {
		got.retryable = rb.Retryable()
	}
	got.settleable, _ = v.s.Settleable()
	if want.id.IsZero() {
		got.id = want.id // a failed Acquire has no operation id
	}
	return got, want, trace
}

// testSeed is the seed of a seeded test: the environment variable env's, else a random
// one; logged either way, so that a failure can be replayed.
func testSeed(t *testing.T, env string) uint64 {
	t.Helper()
	seed := rand.Uint64()
	if s := os.Getenv(env); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want an unsigned integer", env, s)
		}
		seed = n
	}
	t.Logf("seed %d (%s replays it)", seed, env)
	return seed
}
