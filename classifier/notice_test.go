package classifier_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx/classifier"
)

const committedLocallyDetail = "The transaction has already committed locally, but might not have been replicated to the standby."

func TestCommittedLocallyNotice(t *testing.T) {
	tests := []struct {
		name string
		n    *pgconn.Notice
		want bool
	}{
		{"nil", nil, false},
		{"57P01 WARNING (backend terminated during sync-rep wait)", &pgconn.Notice{
			Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "57P01",
			Message: "canceling the wait for synchronous replication and terminating connection due to administrator command",
			Detail:  committedLocallyDetail,
		}, true},
		{"57P01 WARNING without detail", &pgconn.Notice{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "57P01"}, true},
		{"57P01 localized WARNING", &pgconn.Notice{Severity: "WARNUNG", SeverityUnlocalized: "WARNING", Code: "57P01"}, true},
		{"57P01 WARNING from an old server", &pgconn.Notice{Severity: "WARNING", Code: "57P01"}, true},
		{"01000 WARNING with detail (cancel request during sync-rep wait)", &pgconn.Notice{
			Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "01000",
			Message: "canceling wait for synchronous replication due to user request",
			Detail:  committedLocallyDetail,
		}, true},
		{"01000 WARNING without the detail (RAISE WARNING)", &pgconn.Notice{
			Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "01000", Message: "trigger says hello",
		}, false},
		{"01000 WARNING with another detail", &pgconn.Notice{
			Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "01000", Detail: "something else",
		}, false},
		{"01000 NOTICE with the detail", &pgconn.Notice{
			Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "01000", Detail: committedLocallyDetail,
		}, false},
		{"57P01 NOTICE", &pgconn.Notice{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "57P01"}, false},
		{"00000 NOTICE", &pgconn.Notice{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "00000"}, false},
		{"other WARNING code with the detail", &pgconn.Notice{
			Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: "25P01", Detail: committedLocallyDetail,
		}, false},
		{"translated severity says WARNING but unlocalized says NOTICE", &pgconn.Notice{
			Severity: "WARNING", SeverityUnlocalized: "NOTICE", Code: "57P01",
		}, false},
		{"empty notice", &pgconn.Notice{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := classifier.CommittedLocallyNotice(tt.n); got != tt.want {
				t.Errorf("CommittedLocallyNotice() = %v, want %v", got, tt.want)
			}
		})
	}
}
