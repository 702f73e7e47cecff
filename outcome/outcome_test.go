package outcome_test

import (
	"strings"
	"testing"

	"github.com/txevidence/otelpgxtx/outcome"
)

func TestOutcomeStringValues(t *testing.T) {
	tests := []struct {
		o    outcome.Outcome
		want string
	}{
		{outcome.OutcomeCommitted, "committed"},
		{outcome.OutcomeParticipating, "participating"},
		{outcome.OutcomeRolledBack, "rolled_back"},
		{outcome.OutcomeIndeterminate, "indeterminate"},
		{outcome.OutcomeCommittedWithPostCommitFailure, "committed_with_post_commit_failure"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.o.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
			if !tt.o.Valid() {
				t.Errorf("Valid() = false, want true")
			}
			got, err := outcome.ParseOutcome(tt.want)
			if err != nil {
				t.Fatalf("ParseOutcome(%q) error: %v", tt.want, err)
			}
			if got != tt.o {
				t.Errorf("ParseOutcome(%q) = %v, want %v", tt.want, got, tt.o)
			}
		})
	}
}

func TestOutcomesListsAllFiveInOrder(t *testing.T) {
	want := []string{"committed", "participating", "rolled_back", "indeterminate", "committed_with_post_commit_failure"}
	got := outcome.Outcomes()
	if len(got) != len(want) {
		t.Fatalf("Outcomes() has %d values, want %d", len(got), len(want))
	}
	seen := map[outcome.Outcome]bool{}
	for i, o := range got {
		if o.String() != want[i] {
			t.Errorf("Outcomes()[%d] = %q, want %q", i, o, want[i])
		}
		if seen[o] {
			t.Errorf("Outcomes() repeats %v", o)
		}
		seen[o] = true
	}
	// The returned slice is the caller's: changing it must not change the next call.
	got[0] = 0
	if outcome.Outcomes()[0] != outcome.OutcomeCommitted {
		t.Error("Outcomes() returns a shared slice")
	}
}

func TestOutcomeZeroValueInvalid(t *testing.T) {
	var o outcome.Outcome
	if o.Valid() {
		t.Fatal("zero Outcome is Valid")
	}
	if got, want := o.String(), "outcome(0)"; got != want {
		t.Errorf("zero Outcome String() = %q, want %q", got, want)
	}
	for _, o := range outcome.Outcomes() {
		if o == 0 {
			t.Error("Outcomes() contains the zero Outcome")
		}
	}
}

func TestOutcomeOutOfRangeInvalid(t *testing.T) {
	for _, o := range []outcome.Outcome{6, 7, 100, 255} {
		if o.Valid() {
			t.Errorf("Outcome(%d).Valid() = true", uint8(o))
		}
		if !strings.HasPrefix(o.String(), "outcome(") {
			t.Errorf("Outcome(%d).String() = %q, want outcome(N)", uint8(o), o.String())
		}
	}
}

func TestParseOutcomeUnknown(t *testing.T) {
	for _, s := range []string{
		"", "Committed", "COMMITTED", "commit", "rolledback", "rolled-back", "unknown",
		"committing", "indeterminate ", "outcome(0)", "outcome(1)", "committed_with_post_commit",
	} {
		t.Run(s, func(t *testing.T) {
			o, err := outcome.ParseOutcome(s)
			if err == nil {
				t.Fatalf("ParseOutcome(%q) = %v, nil; want error", s, o)
			}
			if o.Valid() {
				t.Errorf("ParseOutcome(%q) returned a valid outcome %v with its error", s, o)
			}
			if !strings.Contains(err.Error(), "unknown outcome") {
				t.Errorf("error %q does not say unknown outcome", err)
			}
		})
	}
}

func TestOperationIDRoundTrip(t *testing.T) {
	ids := []outcome.OperationID{
		{},
		{0x01},
		{15: 0xff},
		{0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0xa, 0xb},
		outcome.NewOperationID(),
		outcome.NewOperationID(),
	}
	for _, id := range ids {
		s := id.String()
		t.Run(s, func(t *testing.T) {
			if len(s) != 32 {
				t.Errorf("String() has %d characters, want 32", len(s))
			}
			if s != strings.ToLower(s) {
				t.Errorf("String() = %q is not lower case", s)
			}
			got, err := outcome.ParseOperationID(s)
			if err != nil {
				t.Fatalf("ParseOperationID(%q) error: %v", s, err)
			}
			if got != id {
				t.Errorf("ParseOperationID(%q) = %v, want %v", s, got, id)
			}
		})
	}
}

func TestOperationIDZero(t *testing.T) {
	var id outcome.OperationID
	if !id.IsZero() {
		t.Error("zero OperationID: IsZero() = false")
	}
	if got, want := id.String(), strings.Repeat("0", 32); got != want {
		t.Errorf("zero OperationID String() = %q, want %q", got, want)
	}
	if (outcome.OperationID{15: 1}).IsZero() {
		t.Error("non-zero OperationID: IsZero() = true")
	}
}

func TestNewOperationIDIsFreshAndNonZero(t *testing.T) {
	seen := map[outcome.OperationID]bool{}
	for range 100 {
		id := outcome.NewOperationID()
		if id.IsZero() {
			t.Fatal("NewOperationID returned the zero id")
		}
		if seen[id] {
			t.Fatalf("NewOperationID repeated %v", id)
		}
		seen[id] = true
	}
}

func TestParseOperationIDMalformed(t *testing.T) {
	valid := "00112233445566778899aabbccddeeff"
	tests := []struct{ name, in string }{
		{"empty", ""},
		{"too short by one", valid[:31]},
		{"too short by two", valid[:30]},
		{"too long by one", valid + "0"},
		{"too long by two", valid + "00"},
		{"non-hex letter", "g0112233445566778899aabbccddeeff"},
		{"non-hex last", "00112233445566778899aabbccddeefz"},
		{"space", "00112233445566778899aabbccddee f"},
		{"uuid with dashes", "00112233-4455-6677-8899-aabbccddeeff"},
		{"0x prefix", "0x112233445566778899aabbccddeeff"},
		{"multibyte rune", "é0112233445566778899aabbccddeef"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := outcome.ParseOperationID(tt.in)
			if err == nil {
				t.Fatalf("ParseOperationID(%q) = %v, nil; want error", tt.in, id)
			}
			if !id.IsZero() {
				t.Errorf("ParseOperationID(%q) returned non-zero id %v with its error", tt.in, id)
			}
			if !strings.Contains(err.Error(), "malformed operation id") {
				t.Errorf("error %q does not say malformed operation id", err)
			}
		})
	}
}

func TestReconciliationRefRoundTrip(t *testing.T) {
	tests := []struct {
		ref  outcome.ReconciliationRef
		want string
	}{
		{outcome.ReconciliationRef{XID: 0, SystemIdentifier: 1, Timeline: 1}, "pg:1/1/0"},
		{outcome.ReconciliationRef{XID: 748, SystemIdentifier: 7350493852390428123, Timeline: 1}, "pg:7350493852390428123/1/748"},
		{outcome.ReconciliationRef{XID: 1<<64 - 1, SystemIdentifier: 1<<64 - 1, Timeline: 1<<32 - 1}, "pg:18446744073709551615/4294967295/18446744073709551615"},
		{outcome.ReconciliationRef{XID: 4294967296 + 5, SystemIdentifier: 42, Timeline: 3}, "pg:42/3/4294967301"},
		{outcome.ReconciliationRef{XID: 9, SystemIdentifier: 42, Timeline: 3, ServerStart: 1795000000123456}, "pg:42/3/9/1795000000123456"},
		{outcome.ReconciliationRef{XID: 9, SystemIdentifier: 42, Timeline: 3, ServerStart: 1795000000123456, StatsReset: 1795000000654321},
			"pg:42/3/9/1795000000123456/1795000000654321"},
		{outcome.ReconciliationRef{XID: 9, SystemIdentifier: 42, Timeline: 3, ServerStart: 1795000000123456, StatsReset: 1795000000654321, Pooled: true},
			"pg:42/3/9/1795000000123456/1795000000654321;pooled"},
		{outcome.ReconciliationRef{XID: 9, SystemIdentifier: 42, Timeline: 3, ServerStart: 1795000000123456, StatsReset: 1795000000654321, FlushLSN: 0x15224C0},
			"pg:42/3/9/1795000000123456/1795000000654321;flushed=0/15224C0"},
		{outcome.ReconciliationRef{XID: 9, SystemIdentifier: 42, Timeline: 3, ServerStart: 1795000000123456, Pooled: true, FlushLSN: 0x1_0000_00A0},
			"pg:42/3/9/1795000000123456;pooled;flushed=1/A0"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.ref.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
			if err := tt.ref.Validate(); err != nil {
				t.Errorf("Validate() = %v", err)
			}
			got, err := outcome.ParseReconciliationRef(tt.want)
			if err != nil {
				t.Fatalf("ParseReconciliationRef(%q) error: %v", tt.want, err)
			}
			if got != tt.ref {
				t.Errorf("ParseReconciliationRef(%q) = %+v, want %+v", tt.want, got, tt.ref)
			}
			nr, err := outcome.NewReconciliationRef(tt.ref.XID, tt.ref.SystemIdentifier, tt.ref.Timeline)
			nr.ServerStart, nr.StatsReset, nr.Pooled, nr.FlushLSN = tt.ref.ServerStart, tt.ref.StatsReset, tt.ref.Pooled, tt.ref.FlushLSN
			if err != nil || nr != tt.ref {
				t.Errorf("NewReconciliationRef = %+v, %v; want %+v, nil", nr, err, tt.ref)
			}
			if got.NoWrites() != (tt.ref.XID == 0) {
				t.Errorf("NoWrites() = %v for XID %d", got.NoWrites(), tt.ref.XID)
			}
		})
	}
}

func TestParseReconciliationRefMalformed(t *testing.T) {
	tests := []struct{ name, in string }{
		{"empty", ""},
		{"prefix only", "pg:"},
		{"two fields", "pg:1/2"},
		{"six fields", "pg:1/2/3/4/5/6"},
		{"zero server start", "pg:1/2/3/0"},
		{"zero stats reset", "pg:1/2/3/4/0"},
		{"negative stats reset", "pg:1/2/3/4/-5"},
		{"stats reset without a start", "pg:1/2/3//5"},
		{"pooled twice", "pg:1/2/3;pooled;pooled"},
		{"pooled after checked", "pg:1/2/3;checked=5;pooled"},
		{"flushed without a position", "pg:1/2/3;flushed="},
		{"flushed at zero", "pg:1/2/3;flushed=0/0"},
		{"flushed not hexadecimal", "pg:1/2/3;flushed=0/G1"},
		{"flushed without a slash", "pg:1/2/3;flushed=15224C0"},
		{"flushed after checked", "pg:1/2/3;checked=5;flushed=0/1"},
		{"negative server start", "pg:1/2/3/-4"},
		{"non-numeric system identifier", "pg:a/1/2"},
		{"non-numeric timeline", "pg:1/b/2"},
		{"non-numeric xid", "pg:1/1/c"},
		{"wrong scheme", "x:1/1/1"},
		{"no scheme", "1/1/1"},
		{"upper-case scheme", "PG:1/1/1"},
		{"zero system identifier", "pg:0/1/1"},
		{"zero timeline", "pg:1/0/1"},
		{"timeline overflow 2^32", "pg:1/4294967296/1"},
		{"timeline overflow 2^32+1", "pg:1/4294967297/1"},
		{"system identifier overflow 2^64", "pg:18446744073709551616/1/1"},
		{"xid overflow 2^64", "pg:1/1/18446744073709551616"},
		{"negative xid", "pg:1/1/-1"},
		{"negative timeline", "pg:1/-1/1"},
		{"plus sign", "pg:+1/1/1"},
		{"empty field", "pg:1//1"},
		{"trailing slash", "pg:1/1/1/"},
		{"spaces", "pg: 1/1/1"},
		{"hex field", "pg:0x1/1/1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ref, err := outcome.ParseReconciliationRef(tt.in)
			if err == nil {
				t.Fatalf("ParseReconciliationRef(%q) = %+v, nil; want error", tt.in, ref)
			}
			if ref != (outcome.ReconciliationRef{}) {
				t.Errorf("ParseReconciliationRef(%q) returned %+v with its error, want zero", tt.in, ref)
			}
			if !strings.Contains(err.Error(), "malformed reconciliation reference") {
				t.Errorf("error %q does not say malformed reconciliation reference", err)
			}
		})
	}
}

func TestReconciliationRefValidate(t *testing.T) {
	tests := []struct {
		name    string
		ref     outcome.ReconciliationRef
		wantErr string
	}{
		{"zero value", outcome.ReconciliationRef{}, "zero system identifier"},
		{"zero system identifier", outcome.ReconciliationRef{XID: 9, Timeline: 1}, "zero system identifier"},
		{"zero timeline", outcome.ReconciliationRef{XID: 9, SystemIdentifier: 1}, "zero timeline"},
		{"valid no writes", outcome.ReconciliationRef{SystemIdentifier: 1, Timeline: 1}, ""},
		{"valid", outcome.ReconciliationRef{XID: 9, SystemIdentifier: 1, Timeline: 2}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.ref.Validate()
			_, nerr := outcome.NewReconciliationRef(tt.ref.XID, tt.ref.SystemIdentifier, tt.ref.Timeline)
			if tt.wantErr == "" {
				if err != nil || nerr != nil {
					t.Fatalf("Validate() = %v, NewReconciliationRef error = %v; want nil", err, nerr)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Validate() = %v, want error containing %q", err, tt.wantErr)
			}
			if nerr == nil || !strings.Contains(nerr.Error(), tt.wantErr) {
				t.Errorf("NewReconciliationRef error = %v, want error containing %q", nerr, tt.wantErr)
			}
		})
	}
}
