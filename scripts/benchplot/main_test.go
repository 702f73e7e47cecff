package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// raw is benchmark output as scripts/bench collects it: two rounds, a unit line, a
// failing line that is not a result, and figures of another benchmark.
const raw = `goos: linux
goarch: amd64
pkg: github.com/txevidence/otelpgxtx
BenchmarkTx/rtt=0ms/write/sampled/v=a_pgx-2  100  1000 ns/op  100 client-µs/tx  50 server-µs/tx  4000 tx/s
BenchmarkTx/rtt=0ms/write/sampled/v=a_pgx-2  100  1000 ns/op  300 client-µs/tx  70 server-µs/tx  2000 tx/s
BenchmarkTx/rtt=0ms/write/sampled/v=a_pgx-2  100  1000 ns/op  200 client-µs/tx  60 server-µs/tx  3000 tx/s
BenchmarkTx/rtt=1ms/write/sampled/v=e_run_capture-2  10  1000 ns/op  200 client-µs/tx  60 server-µs/tx  100 tx/s
BenchmarkTxScale/g=1/write/sampled/v=a_pgx-2  10  1 ns/op  3000 tx/s  100 client-µs/tx
BenchmarkTxScale/g=64/write/sampled/v=a_pgx-2  10  1 ns/op  9000 tx/s  120 client-µs/tx
BenchmarkTxScale/g=16/write/sampled/v=a_pgx-2  10  1 ns/op  8000 tx/s  110 client-µs/tx
BenchmarkHookTx/sampled/v=a_pgx-2  10  5000 ns/op
--- FAIL: BenchmarkX
`

func TestPlot(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "raw.txt")
	if err := os.WriteFile(in, []byte(raw), 0o644); err != nil {
		t.Fatal(err)
	}
	s := samples{}
	if err := s.read(in); err != nil {
		t.Fatal(err)
	}
	if got, ok := s.median("Tx/rtt=0ms/write/sampled/v=a_pgx", unitClient); !ok || got != 200 {
		t.Errorf("median client CPU = %v, %v; want 200 (of 100, 300, 200)", got, ok)
	}
	if got, ok := s.median("Tx/rtt=0ms/write/sampled/v=a_pgx", unitTPS); !ok || got != 3000 {
		t.Errorf("median tx/s = %v, %v; want 3000", got, ok)
	}
	if _, ok := s.median("Tx/rtt=0ms/write/sampled/v=b_otelpgx", unitTPS); ok {
		t.Error("a median of a benchmark that did not run")
	}
	if got := strings.Join(s.keyValues("TxScale/", "g"), ","); got != "1,16,64" {
		t.Errorf("goroutine counts %s, want 1,16,64 (sorted by number)", got)
	}
	if got := strings.Join(s.rtts(), ","); got != "0ms,1ms" {
		t.Errorf("round-trip times %s, want 0ms,1ms", got)
	}

	out := filepath.Join(dir, "chart.svg")
	if err := run(out, "test machine", []string{in}); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "test machine", "Throughput, write, sampled", "RTT +0ms", "RTT +1ms", "waiting"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("the chart has no %q", want)
		}
	}
	// The title starts inside the canvas, not cut off at its left edge.
	end := strings.Index(string(svg), ">test machine</text>")
	start := strings.LastIndex(string(svg[:max(end, 0)]), `<text x="`)
	if end < 0 || start < 0 {
		t.Fatal("no title text element")
	}
	x, err := strconv.ParseFloat(strings.SplitN(string(svg[start+len(`<text x="`):end]), `"`, 2)[0], 64)
	if err != nil || x < 0 {
		t.Errorf("the title starts at x = %v (%v): cut off", x, err)
	}
}

func TestPlotNothing(t *testing.T) {
	in := filepath.Join(t.TempDir(), "raw.txt")
	if err := os.WriteFile(in, []byte("BenchmarkHookTx/sampled/v=a_pgx-2  10  5000 ns/op\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(filepath.Join(t.TempDir(), "chart.svg"), "", []string{in}); err == nil {
		t.Error("a chart without any figure: no error")
	}
}
