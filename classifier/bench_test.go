package classifier_test

import (
	"fmt"
	"io"
	"testing"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

var sinkVerdict classifier.Verdict

func BenchmarkClassify(b *testing.B) {
	serialization := pgErr("ERROR", "ERROR", "40001")
	wrapped := fmt.Errorf("commit: %w", serialization)
	cases := []struct {
		name  string
		phase outcome.Phase
		err   error
	}{
		{"committing/nil", outcome.PhaseCommitting, nil},
		{"committing/PgError", outcome.PhaseCommitting, serialization},
		{"committing/wrapped_PgError", outcome.PhaseCommitting, wrapped},
		{"committing/EOF", outcome.PhaseCommitting, io.EOF},
		{"active/PgError", outcome.PhaseActive, serialization},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sinkVerdict = classifier.Classify(bc.phase, bc.err, classifier.Facts{})
			}
		})
	}
}

// TestClassifyHotPathDoesNotAllocate keeps the "no allocation on the hot path" promise
// checked by the ordinary test run, not only by benchmarks.
func TestClassifyHotPathDoesNotAllocate(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts are not meaningful in -short runs")
	}
	serialization := pgErr("ERROR", "ERROR", "40001")
	cases := []struct {
		name  string
		phase outcome.Phase
		err   error
	}{
		{"committing/nil", outcome.PhaseCommitting, nil},
		{"committing/PgError", outcome.PhaseCommitting, serialization},
		{"active/PgError", outcome.PhaseActive, serialization},
	}
	for _, tc := range cases {
		allocs := testing.AllocsPerRun(100, func() {
			sinkVerdict = classifier.Classify(tc.phase, tc.err, classifier.Facts{})
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocs/op, want 0", tc.name, allocs)
		}
	}
}
