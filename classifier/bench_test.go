package classifier_test

import (
	"fmt"
	"io"
	"testing"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

var sinkVerdict classifier.Classification

// hotPathCase is one input of the classifier's hot path; the benchmark and the
// allocation test share them.
type hotPathCase struct {
	name  string
	phase outcome.Phase
	err   error
}

func hotPathCases() []hotPathCase {
	serialization := pgErr("ERROR", "ERROR", "40001")
	return []hotPathCase{
		{"committing/nil", outcome.PhaseCommitting, nil},
		{"committing/PgError", outcome.PhaseCommitting, serialization},
		{"committing/wrapped_PgError", outcome.PhaseCommitting, fmt.Errorf("commit: %w", serialization)},
		{"committing/EOF", outcome.PhaseCommitting, io.EOF},
		{"active/PgError", outcome.PhaseActive, serialization},
	}
}

func BenchmarkClassify(b *testing.B) {
	for _, bc := range hotPathCases() {
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
	for _, tc := range hotPathCases() {
		allocs := testing.AllocsPerRun(100, func() {
			sinkVerdict = classifier.Classify(tc.phase, tc.err, classifier.Facts{})
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocs/op, want 0", tc.name, allocs)
		}
	}
}
