package outcome

import (
	"slices"
	"strings"
	"testing"
)

// TestParseMarkerTable: the quoted form and plain lower-case names, schema-qualified, read
// back to the parts QuoteMarkerTable quotes; an unqualified name, a name PostgreSQL would
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
		got, err := ParseMarkerTable(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseMarkerTable(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			continue
		}
		q, err := QuoteMarkerTable(got...)
		if err != nil {
			t.Fatal(err)
		}
		if back, err := ParseMarkerTable(q); err != nil || !slices.Equal(back, got) {
			t.Errorf("%q quoted as %q reads back as %q, %v", tc.in, q, back, err)
		}
	}
	for _, in := range []string{"", "tx_marker", `"tx_marker"`, "db.app.t", "App.tx", "app..t", "a.b.c.d", `"a`, `""`, `"a"b`, "s.1t", "s.$t", "a.", ".a", "a b", "s.a-b", "\"a\x00\".t"} {
		if got, err := ParseMarkerTable(in); err == nil {
			t.Errorf("ParseMarkerTable(%q) = %q, want an error", in, got)
		}
	}
	for _, parts := range [][]string{nil, {"tx_marker"}, {"db", "s", "t"}, {"s", ""}, {"s", "a\x00"}} {
		if q, err := QuoteMarkerTable(parts...); err == nil {
			t.Errorf("QuoteMarkerTable(%q) = %q, want an error: a marker table is schema-qualified", parts, q)
		}
	}
}

// TestMarkerRefTable: a reference names the database and the schema-qualified table;
// anything else is refused, and the two parts read back.
func TestMarkerRefTable(t *testing.T) {
	got, err := MarkerRefTable(`my "db"`, `"app"."tx_marker"`)
	if err != nil || got != `"my ""db"""."app"."tx_marker"` {
		t.Fatalf("MarkerRefTable = %q, %v", got, err)
	}
	r := ReconciliationRef{SystemIdentifier: 7, Timeline: 1, MarkerTable: got, Operation: OperationID{1}, CheckedAt: 42}
	if r.MarkerDatabase() != `my "db"` || r.MarkerRelation() != `"app"."tx_marker"` {
		t.Errorf("MarkerDatabase, MarkerRelation = %q, %q", r.MarkerDatabase(), r.MarkerRelation())
	}
	back, err := ParseReconciliationRef(r.String())
	if err != nil || back != r {
		t.Errorf("ParseReconciliationRef(%q) = %+v, %v; want %+v", r.String(), back, err, r)
	}
	for _, table := range []string{`"tx_marker"`, `app.tx_marker`, `"d"."app"."t"`, ``} {
		if got, err := MarkerRefTable("db", table); err == nil {
			t.Errorf("MarkerRefTable(db, %q) = %q, want an error", table, got)
		}
	}
	for _, s := range []string{
		`pg:7/1/0;marker=01000000000000000000000000000000@"app"."t"`, // no database
		`pg:7/1/0;checked=0;marker=01000000000000000000000000000000@"d"."app"."t"`,
		`pg:7/1/0;checked=x`,
	} {
		if _, err := ParseReconciliationRef(s); err == nil || !strings.Contains(err.Error(), "malformed") {
			t.Errorf("ParseReconciliationRef(%q) = %v, want a malformed reference", s, err)
		}
	}
}
