package outcome

import (
	"slices"
	"testing"
)

// TestParseMarkerTable: the quoted form a reference carries and plain lower-case names
// read back to the parts QuoteMarkerTable quotes; a name PostgreSQL would fold or that
// cannot be a table is refused.
func TestParseMarkerTable(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{`app.tx_marker`, []string{"app", "tx_marker"}},
		{`"app"."tx_marker"`, []string{"app", "tx_marker"}},
		{`tx_marker`, []string{"tx_marker"}},
		{`"App"."Tx ""Marker"""`, []string{"App", `Tx "Marker"`}},
		{`db.app."x.y"`, []string{"db", "app", "x.y"}},
		{`_t$1`, []string{"_t$1"}},
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
	for _, in := range []string{"", "App.tx", "app..t", "a.b.c.d", `"a`, `""`, `"a"b`, "1t", "$t", "a.", ".a", "a b", "a-b", "\"a\x00\""} {
		if got, err := ParseMarkerTable(in); err == nil {
			t.Errorf("ParseMarkerTable(%q) = %q, want an error", in, got)
		}
	}
	for _, in := range []string{"app.tx", "tx"} {
		if err := checkQuotedTable(in); err == nil {
			t.Errorf("checkQuotedTable(%q) accepted an unquoted name: a reference always carries the quoted form", in)
		}
	}
}
