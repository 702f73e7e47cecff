package classifier_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/pgtest"
)

// testLocales are the languages TestRealCommittedLocallyLocalized runs the server's
// messages in: Latin, Cyrillic and CJK scripts, one with a line break in the detail (fr).
// .ci/run generates them; locale-gen makes them on Debian.
var testLocales = []string{"de_DE.UTF-8", "fr_FR.UTF-8", "ja_JP.UTF-8", "ru_RU.UTF-8", "zh_CN.UTF-8"}

const (
	englishDetail   = "The transaction has already committed locally, but might not have been replicated to the standby."
	englishCanceled = "canceling wait for synchronous replication due to user request"
	englishShutdown = "canceling the wait for synchronous replication and terminating connection due to administrator command"
)

// requireLocales fails the test, naming the command that fixes it, when the OS lacks a
// locale: the server cannot set lc_messages to a locale the C library does not have.
func requireLocales(t *testing.T, locales []string) {
	t.Helper()
	out, err := exec.Command("locale", "-a").Output()
	if err != nil {
		t.Fatalf("locale -a: %v (install the locales package)", err)
	}
	have := map[string]bool{}
	for _, l := range strings.Fields(string(out)) {
		have[strings.ToLower(strings.ReplaceAll(l, "-", ""))] = true
	}
	var missing []string
	for _, l := range locales {
		if !have[strings.ToLower(strings.ReplaceAll(l, "-", ""))] {
			missing = append(missing, l)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("the OS lacks the locales %v that this test sets lc_messages to; on Debian: "+
			"apt-get install locales-all, or apt-get install locales, uncomment them in /etc/locale.gen and run locale-gen (.ci/run does)", missing)
	}
}

// commitEndedInSyncRep inserts id into table on c and commits with synchronous_commit =
// on, then ends the synchronous-replication wait with signal (srv.Cancel or srv.Terminate)
// and returns the transaction's xid once COMMIT returned.
func commitEndedInSyncRep(t *testing.T, ctx context.Context, c *noticeConn, table string, id int,
	signal func(context.Context, uint32) error) uint64 {
	t.Helper()
	pid := c.PgConn().PID()
	tx, xid := beginInsert(t, ctx, c, table, id, syncRepOn)
	done := commitAsync(ctx, tx)
	if err := srv.WaitForWaitEvent(ctx, pid, "SyncRep"); err != nil {
		t.Fatal(err)
	}
	if err := signal(ctx, pid); err != nil {
		t.Fatal(err)
	}
	logErr(t, "tx.Commit", awaitCommit(t, ctx, done))
	logNotices(t, c)
	return xid
}

// TestRealCommittedLocallyLocalized ends a COMMIT's synchronous-replication wait with a
// cancel request (WARNING 01000) and with a backend termination (WARNING 57P01) in
// sessions whose lc_messages is another language: the server sends the translated
// warning, and CommittedLocallyNotice recognises both.
func TestRealCommittedLocallyLocalized(t *testing.T) {
	requireLocales(t, testLocales)
	const table = "real_localized_syncrep"
	for _, loc := range testLocales {
		for _, end := range []string{"cancel 01000", "terminate 57P01"} {
			t.Run(loc+"/"+end, func(t *testing.T) {
				ctx := realCtx(t)
				srv.FreshTable(t, ctx, table, "id int primary key")
				c := realConnect(t, ctx, srv.ConnString(), func(cfg *pgx.ConnConfig) {
					cfg.RuntimeParams["lc_messages"] = loc
				})
				pid := c.PgConn().PID()
				code, english, signal := codeWarning, englishCanceled, srv.Cancel
				if end == "terminate 57P01" {
					code, english, signal = codeAdminShutdown, englishShutdown, srv.Terminate
				}
				xid := commitEndedInSyncRep(t, ctx, c, table, 1, signal)
				var seen bool
				for _, n := range c.Notices() {
					if n.Code != code || n.SeverityUnlocalized != "WARNING" {
						continue
					}
					seen = true
					// Severity alone may stay English (ja keeps "WARNING").
					if n.Message == english || n.Detail == englishDetail {
						t.Errorf("the warning is not translated (message %q, detail %q): lc_messages = %s had no effect",
							n.Message, n.Detail, loc)
					}
					if !classifier.CommittedLocallyNotice(n) {
						t.Errorf("CommittedLocallyNotice(%s %q / %q) = false", n.Code, n.Message, n.Detail)
					}
				}
				if !seen {
					t.Fatalf("no WARNING %s notice", code)
				}
				if end == "terminate 57P01" {
					pgtest.NoError(t, srv.WaitBackendGone(ctx, pid))
				} else {
					waitBackendSettled(t, ctx, pid)
				}
				checkXact(t, ctx, xid, "committed")
			})
		}
	}
}

// TestRealCommittedLocallyOtherDatabaseEncoding: in a LATIN1 database the server
// translates into the database encoding and converts to the client encoding, so with
// client_encoding = UTF8 (which pgx requires for its own text handling, and which a UTF-8
// database gives by default) the client sees the same German text as in a UTF-8 database.
// A language the database encoding cannot represent arrives as question marks and is
// not recognised: the fact is lost, never invented.
func TestRealCommittedLocallyOtherDatabaseEncoding(t *testing.T) {
	requireLocales(t, testLocales)
	ctx := realCtx(t)
	if err := srv.Exec(ctx, "drop database if exists real_latin1"); err != nil {
		t.Fatal(err)
	}
	if err := srv.Exec(ctx, "create database real_latin1 encoding 'LATIN1' template template0"); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(srv.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Database = "real_latin1"
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "create table t (id int primary key)"); err != nil {
		t.Fatal(err)
	}
	for id, tc := range []struct {
		locale     string
		recognised bool
	}{{"de_DE.UTF-8", true}, {"ja_JP.UTF-8", false}} {
		t.Run(tc.locale, func(t *testing.T) {
			c := realConnect(t, ctx, srv.ConnString(), func(cfg *pgx.ConnConfig) {
				cfg.Database = "real_latin1"
				cfg.RuntimeParams["lc_messages"] = tc.locale
				cfg.RuntimeParams["client_encoding"] = "UTF8"
			})
			pid := c.PgConn().PID()
			xid := commitEndedInSyncRep(t, ctx, c, "t", id, srv.Cancel)
			var seen bool
			for _, n := range c.Notices() {
				if n.Code == codeWarning && n.SeverityUnlocalized == "WARNING" {
					seen = true
					if got := classifier.CommittedLocallyNotice(n); got != tc.recognised {
						t.Errorf("CommittedLocallyNotice(detail %q) = %v, want %v", n.Detail, got, tc.recognised)
					}
				}
			}
			if !seen {
				t.Fatal("no WARNING 01000 notice")
			}
			waitBackendSettled(t, ctx, pid)
			if st, _, err := srv.XactStatus(ctx, xid); err != nil || st != "committed" {
				t.Errorf("pg_xact_status(%d) = %q, %v; want committed", xid, st, err)
			}
		})
	}
}
