//go:build !race

package otelpgxtx

import (
	"context"
	"testing"
	"unsafe"

	"github.com/txevidence/otelpgxtx/internal/frame"
)

// TestHookAllocs holds the allocation targets of the Tracer and of Run as a test, where
// the benchmarks only report them: per transaction over fakePG, sampled, the Tracer with its
// defaults allocates no more than otelpgx alone (c ≤ b: the frame's events stand for the
// BEGIN and COMMIT spans); with every statement span (i) it adds at most 6 allocations to
// otelpgx's (i−b: its frame span alone costs 10, and the operation names it hands otelpgx
// from its cache save otelpgx's one per statement); Run adds at most 6 to hand-written
// pgx's (d−c); per unsampled statement the Tracer adds none. Allocation counts do not
// depend on the machine's speed, so this is a test that can fail only on a change of the
// code. The race detector changes them (it makes sync.Pool drop what it is given at
// random), so this file is built without it: `make test` runs it in a pass of its own.
func TestHookAllocs(t *testing.T) {
	allocs := func(v string, s benchSampling) float64 {
		f := newBenchFake(t, v, s)
		defer f.close()
		return testing.AllocsPerRun(200, func() {
			if err := f.tx(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
	sampled, unsampled := benchSamplings[0], benchSamplings[1]
	b, c, d, i := allocs(benchB, sampled), allocs(benchC, sampled), allocs(benchD, sampled), allocs(benchI, sampled)
	t.Logf("sampled allocs/tx: b %.1f, c %.1f, d %.1f, i %.1f", b, c, d, i)
	if c > b {
		t.Errorf("the Tracer allocates %.1f per sampled transaction, otelpgx alone %.1f: want no more", c, b)
	}
	if i-b > 6 {
		t.Errorf("the Tracer with every statement span adds %.1f allocations per sampled transaction, want at most 6", i-b)
	}
	if d-c > 6 {
		t.Errorf("Run adds %.1f allocations per sampled transaction, want at most 6", d-c)
	}
	ub, uc := allocs(benchB, unsampled), allocs(benchC, unsampled)
	t.Logf("unsampled allocs/tx: b %.1f, c %.1f", ub, uc)
	// Per statement: the frame's own allocations are per transaction, at most 3 (c−b
	// unsampled in BenchmarkHookTx); the five statements add none.
	if uc-ub > 3 {
		t.Errorf("the Tracer adds %.1f allocations per unsampled transaction, want at most 3 (none per statement)", uc-ub)
	}
}

// TestAutocommitAllocs holds the allocation floor of an autocommit statement on a pool
// over fakePG (BenchmarkHookAutocommitPool), per statement: the Tracer without a frame (k,
// every write's implicit frame refused) allocates no more than otelpgx alone (b) sampled,
// and one more unsampled (the acquire's start, carried in its context to its end for the
// pool metrics' wait time: otelpgx carries its own only in a span); a read, which makes
// no frame, costs what k costs; a committed write's frame (c−k) costs one allocation
// unsampled (the frame: a context may still hold it when the next one starts, so it is
// never reused) and two sampled (the frame, and its operation id's text on the
// statement's span). Before the frame's phase events and its other attributes left the
// committed write's span (issue 66), c−k sampled was 6 (51 against 45).
func TestAutocommitAllocs(t *testing.T) {
	for _, s := range benchSamplings {
		var n [2]map[string]float64 // [write, read][variant]
		for i, stmt := range benchAutocommitFakeStatements {
			n[i] = map[string]float64{}
			for _, v := range []string{benchB, benchK, benchC} {
				ctx, exec, _ := newBenchAutocommitPool(t, v, s, stmt.sql)
				n[i][v] = testing.AllocsPerRun(200, func() {
					if err := exec(ctx); err != nil {
						t.Fatal(err)
					}
				})
			}
		}
		w, r := n[0], n[1]
		t.Logf("%s allocs per statement: write b %.1f, k %.1f, c %.1f; read b %.1f, k %.1f, c %.1f",
			s.name, w[benchB], w[benchK], w[benchC], r[benchB], r[benchK], r[benchC])
		kb, frame := 1.0, 1.0
		if s.name == "sampled" {
			kb, frame = 0, 2
		}
		if d := w[benchK] - w[benchB]; d > kb {
			t.Errorf("%s: the Tracer without a frame adds %.1f allocations to otelpgx's per write, want at most %.0f", s.name, d, kb)
		}
		if d := r[benchK] - r[benchB]; d > kb {
			t.Errorf("%s: the Tracer adds %.1f allocations to otelpgx's per read, want at most %.0f", s.name, d, kb)
		}
		if r[benchC] != r[benchK] {
			t.Errorf("%s: a read allocates %.1f with the implicit frames on, %.1f without: it makes no frame", s.name, r[benchC], r[benchK])
		}
		if d := w[benchC] - w[benchK]; d > frame {
			t.Errorf("%s: a committed write's frame costs %.1f allocations, want at most %.0f", s.name, d, frame)
		}
	}
}

// TestVerdictAllocs: a transaction begun and committed with a Verdict in its context
// allocates no more in the hooks than one without (NewVerdict's own allocations are made
// before, by the caller who asks), sampled and unsampled.
func TestVerdictAllocs(t *testing.T) {
	for _, s := range benchSamplings {
		f := newBenchFake(t, benchC, s)
		vctx, v := NewVerdict(context.Background())
		run := func(ctx context.Context) float64 {
			return testing.AllocsPerRun(200, func() {
				if err := f.tx(ctx); err != nil {
					t.Fatal(err)
				}
			})
		}
		plain, asked := run(context.Background()), run(vctx)
		f.close()
		if res, err := v.Result(); err != nil || res.Outcome().String() != "committed" {
			t.Fatalf("%s: verdict %v, %v", s.name, res, err)
		}
		t.Logf("%s allocs/tx: %.1f without a Verdict, %.1f with", s.name, plain, asked)
		if asked > plain {
			t.Errorf("%s: %.1f allocations per transaction with a Verdict, %.1f without: want no more", s.name, asked, plain)
		}
	}
}

// TestFrameSize: a frame, allocated once per transaction, stays within the 512-byte size
// class, the largest where Go puts no 8-byte header before an object with pointers: the
// parts only some frames use are allocated only then — its evidence's failure when
// something fails, its commit reference (with the frame, in one allocation) when its
// COMMIT carries one. A field more takes it to the 576-byte class with its header, 64
// bytes more per frame (BenchmarkHookAutocommit's B/op).
func TestFrameSize(t *testing.T) {
	if n := unsafe.Sizeof(frame.Frame{}); n > 512 {
		t.Errorf("a frame is %d bytes, want at most 512", n)
	}
}
