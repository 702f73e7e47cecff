package markertable

import (
	"slices"
	"testing"
)

// TestParseMarkerTable: the quoted form and plain lower-case names, schema-qualified, read
// back to the parts Quote quotes; an unqualified name, a name PostgreSQL would
// fold, and one that cannot be a table are refused.
func TestParseMarkerTable(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{`app.tx_marker`, []string{"app", "tx_marker"}},
		{`"app"."tx_marker"`, []string{"app", "tx_marker"}},
		{`"App"."Tx ""Marker"""`, []string{"App", `Tx "Marker"`}},
		{`app."x.y"`, []string{"app", "x.y"}},
		{`s._t$1`, []string{"s", "_t$1"}},
	} {
		got, err := Parse(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("Parse(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			continue
		}
		q, err := Quote(got...)
		if err != nil {
			t.Fatal(err)
		}
		if back, err := Parse(q); err != nil || !slices.Equal(back, got) {
			t.Errorf("%q quoted as %q reads back as %q, %v", tc.in, q, back, err)
		}
	}
	for _, in := range []string{"", "tx_marker", `"tx_marker"`, "db.app.t", "App.tx", "app..t", "a.b.c.d", `"a`, `""`, `"a"b`, "s.1t", "s.$t", "a.", ".a", "a b", "s.a-b", "\"a\x00\".t"} {
		if got, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %q, want an error", in, got)
		}
	}
	for _, parts := range [][]string{nil, {"tx_marker"}, {"db", "s", "t"}, {"s", ""}, {"s", "a\x00"}} {
		if q, err := Quote(parts...); err == nil {
			t.Errorf("Quote(%q) = %q, want an error: a marker table is schema-qualified", parts, q)
		}
	}
}
