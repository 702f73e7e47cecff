package main

import (
	"bytes"
	"os"
	"testing"
)

// TestDashboardCurrent: the committed dashboard is what this program writes, so that an
// edit of the panels here never ships without the JSON that Grafana loads (and that the
// demo's end-to-end test queries), and a hand edit of the JSON never goes unnoticed.
func TestDashboardCurrent(t *testing.T) {
	want, err := render()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not what the generator writes: run `cd scripts/dashboard && go run .`", out)
	}
}

// TestEveryPanelQueries: each panel has queries, each with an expression and a legend.
func TestEveryPanelQueries(t *testing.T) {
	for _, r := range rows {
		for _, p := range r.panels {
			if len(p.queries) == 0 || p.description == "" || p.unit == "" {
				t.Errorf("%s / %s: queries %d, description %q, unit %q", r.title, p.title, len(p.queries), p.description, p.unit)
			}
			for _, q := range p.queries {
				if q.expr == "" || q.legend == "" {
					t.Errorf("%s: query %+v", p.title, q)
				}
			}
		}
	}
}
