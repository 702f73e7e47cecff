package otelpgxtx

import (
	"context"
	"testing"

	"github.com/txevidence/otelpgxtx/internal/verdict"
)

// The cost of asking for the verdict, per transaction (BEGIN, 3 statements, COMMIT over
// fakePG with the Tracer, c_otelpgxtx), in three modes:
//
//   - off: no NewVerdict was ever called: the hooks look for no Verdict (the baseline);
//   - armed: NewVerdict was called somewhere in the process, this caller does not ask:
//     the hooks look it up in the contexts of BEGIN and of the concluding query;
//   - asked: a NewVerdict per transaction, and its Result after Commit.
//
// The flag that spares the lookup is the process's: each side sets it as its mode says
// before each transaction (an atomic store, the same on every side).
var benchVerdictModes = []string{"off", "armed", "asked"}

// benchVerdictTx returns one transaction of f in mode.
func benchVerdictTx(f *benchFake, mode string) func() error {
	return func() error {
		verdict.Asked.Store(mode != "off")
		if mode != "asked" {
			return f.tx(context.Background())
		}
		ctx, v := NewVerdict(context.Background())
		if err := f.tx(ctx); err != nil {
			return err
		}
		_, err := v.Result()
		return err
	}
}

// BenchmarkVerdict is each mode alone (ns/op, allocs/op): compare with benchstat -col /v.
func BenchmarkVerdict(b *testing.B) {
	prev := verdict.Asked.Load()
	defer verdict.Asked.Store(prev)
	for _, s := range benchSamplings {
		for _, mode := range benchVerdictModes {
			b.Run(s.name+"/v="+mode, func(b *testing.B) {
				f := newBenchFake(b, benchC, s)
				defer f.close()
				tx := benchVerdictTx(f, mode)
				b.ReportAllocs()
				benchLoopCPU(b, func() {
					if err := tx(); err != nil {
						b.Fatal(err)
					}
				})
			})
		}
	}
}

// BenchmarkVerdictPair is what armed and asked add to off, paired in time as
// BenchmarkHookPair pairs (Δns/tx, Δcpu-ns/tx), and off against itself, the noise.
func BenchmarkVerdictPair(b *testing.B) {
	prev := verdict.Asked.Load()
	defer verdict.Asked.Store(prev)
	side := func(b *testing.B, s benchSampling, mode string) benchPairSide {
		f := newBenchFake(b, benchC, s)
		return benchPairSide{block: benchPairBlock, run: benchVerdictTx(f, mode),
			quiet: func() { _ = f.tel.tp.ForceFlush(context.Background()) }, close: f.close}
	}
	for _, s := range benchSamplings {
		for _, head := range benchVerdictModes {
			b.Run(s.name+"/v="+head+"-off", func(b *testing.B) {
				base, head := side(b, s, "off"), side(b, s, head)
				defer base.close()
				defer head.close()
				benchPair(b, base, head)
			})
		}
	}
}
