package outcome

import (
	"strings"
	"testing"

	"github.com/txevidence/otelpgxtx/internal/markertable"
)

// TestMarkerRefTable: a reference names the database and the schema-qualified table;
// anything else is refused, and the two parts read back.
func TestMarkerRefTable(t *testing.T) {
	got, err := markertable.RefTable(`my "db"`, `"app"."tx_marker"`)
	if err != nil || got != `"my ""db"""."app"."tx_marker"` {
		t.Fatalf("RefTable = %q, %v", got, err)
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
		if got, err := markertable.RefTable("db", table); err == nil {
			t.Errorf("markertable.RefTable(db, %q) = %q, want an error", table, got)
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
