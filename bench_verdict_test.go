package otelpgxtx

import (
	"context"
	"testing"
)

// BenchmarkVerdict is the cost of asking for the verdict, per transaction (BEGIN, 3
// statements, COMMIT over fakePG with the Tracer, c_otelpgxtx), side by side:
//
//   - v=off: no NewVerdict was ever called: the hooks look for no Verdict (the baseline);
//   - v=armed: NewVerdict was called somewhere in the process, this caller does not ask:
//     the hooks look it up in the BEGIN's and the concluding query's contexts;
//   - v=asked: a NewVerdict per transaction, and its Result after Commit.
//
// Compare with benchstat -col /v. The flag that skips the lookup is the process's, so
// v=off clears it for its run (only a test may).
func BenchmarkVerdict(b *testing.B) {
	for _, s := range benchSamplings {
		for _, mode := range []string{"off", "armed", "asked"} {
			b.Run(s.name+"/v="+mode, func(b *testing.B) {
				f := newBenchFake(b, benchC, s)
				defer f.close()
				prev := verdictsAsked.Load()
				defer verdictsAsked.Store(prev) // NewVerdict sets it again where a test asks
				verdictsAsked.Store(mode != "off")
				ctx := context.Background()
				b.ReportAllocs()
				benchLoopCPU(b, func() {
					tctx := ctx
					var v *Verdict
					if mode == "asked" {
						tctx, v = NewVerdict(ctx)
					}
					if err := f.tx(tctx); err != nil {
						b.Fatal(err)
					}
					if v != nil {
						if _, err := v.Result(); err != nil {
							b.Fatal(err)
						}
					}
				})
			})
		}
	}
}
