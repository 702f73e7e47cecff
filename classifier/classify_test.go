package classifier_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Fabricated errors, shaped like the ones pgx v5 returns.

func pgErr(severity, unlocalized, code string) *pgconn.PgError {
	return &pgconn.PgError{Severity: severity, SeverityUnlocalized: unlocalized, Code: code, Message: "fabricated"}
}

var (
	errUnique        = pgErr("ERROR", "ERROR", "23505")
	errSerialization = pgErr("ERROR", "ERROR", "40001")
	errDeadlock      = pgErr("ERROR", "ERROR", "40P01")
	errInvalidParam  = pgErr("ERROR", "ERROR", "22023")
	errAdminShutdown = pgErr("FATAL", "FATAL", "57P01")
	errCrashShutdown = pgErr("FATAL", "FATAL", "57P02")
	errPanic         = pgErr("PANIC", "PANIC", "XX000")
	// lc_messages=de_DE: Severity is translated, SeverityUnlocalized is not.
	errFatalGerman = pgErr("SCHWERWIEGEND", "FATAL", "57P01")
	errErrorGerman = pgErr("FEHLER", "ERROR", "23505")
	errPanicGerman = pgErr("PANIK", "PANIC", "XX000")
	// PostgreSQL before 9.6 sends no unlocalized severity.
	errFatalOldServer = pgErr("FATAL", "", "57P01")
	errErrorOldServer = pgErr("ERROR", "", "40001")

	errNetOp = &net.OpError{Op: "read", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5432},
		Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	errApp = errors.New("app")
)

// retryableErr is a driver-like error that claims it is safe to retry, like pgconn's
// "conn closed" error when nothing was sent.
type retryableErr struct{ safe bool }

func (e retryableErr) Error() string     { return "conn closed" }
func (e retryableErr) SafeToRetry() bool { return e.safe }

type want struct {
	evidence         classifier.Evidence
	retryable        bool
	committedLocally bool
	sqlstate         string
	reason           string // "" means: not checked
}

type classifyCase struct {
	name  string
	phase outcome.Phase
	err   error
	facts classifier.Facts
	want  want
}

func runClassifyCases(t *testing.T, cases []classifyCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := classifier.Classify(tc.phase, tc.err, tc.facts)
			if v.Evidence() != tc.want.evidence {
				t.Errorf("Evidence() = %v, want %v", v.Evidence(), tc.want.evidence)
			}
			if v.Retryable() != tc.want.retryable {
				t.Errorf("Retryable() = %v, want %v", v.Retryable(), tc.want.retryable)
			}
			if v.CommittedLocally() != tc.want.committedLocally {
				t.Errorf("CommittedLocally() = %v, want %v", v.CommittedLocally(), tc.want.committedLocally)
			}
			if v.SQLState() != tc.want.sqlstate {
				t.Errorf("SQLState() = %q, want %q", v.SQLState(), tc.want.sqlstate)
			}
			if tc.want.reason != "" && v.Reason() != tc.want.reason {
				t.Errorf("Reason() = %q, want %q", v.Reason(), tc.want.reason)
			}
			if v.Reason() == "" {
				t.Error("Reason() is empty")
			}
			// Every classification from Classify must be one NewClassification accepts.
			if _, err := classifier.NewClassification(v.Evidence(), v.Retryable(), v.SQLState(), v.Reason()); err != nil {
				t.Errorf("Classify returned a classification NewClassification refuses: %v", err)
			}
		})
	}
}

const (
	committed  = classifier.EvidenceCommitted
	rolledBack = classifier.EvidenceRolledBack
	unknown    = classifier.EvidenceUnknown
)

// TestClassifyCommitting is the package documentation's rules while committing, one row
// per reply to COMMIT.
func TestClassifyCommitting(t *testing.T) {
	c := outcome.PhaseCommitting
	none := classifier.Facts{Server: classifier.ServerPostgreSQL}
	local := classifier.Facts{Server: classifier.ServerPostgreSQL, CommittedLocally: true}
	runClassifyCases(t, []classifyCase{
		// tag COMMIT, session idle
		{"nil is committed", c, nil, none, want{committed, false, false, "", classifier.ReasonCommitted}},
		{"nil with conn-closed fact is still committed", c, nil, classifier.Facts{Server: classifier.ServerPostgreSQL, ConnClosed: true}, want{committed, false, false, "", classifier.ReasonCommitted}},
		// tag ROLLBACK
		{"rollback tag", c, nil, classifier.Facts{Server: classifier.ServerPostgreSQL, RollbackTag: true}, want{rolledBack, false, false, "", classifier.ReasonCommitRollback}},
		{"ErrTxCommitRollback", c, pgx.ErrTxCommitRollback, none, want{rolledBack, false, false, "", classifier.ReasonCommitRollback}},
		{"ErrTxCommitRollback wrapped", c, fmt.Errorf("commit: %w", pgx.ErrTxCommitRollback), none, want{rolledBack, false, false, "", classifier.ReasonCommitRollback}},
		{"ErrTxCommitRollback wrapped twice", c, fmt.Errorf("outer: %w", fmt.Errorf("commit: %w", pgx.ErrTxCommitRollback)), none, want{rolledBack, false, false, "", classifier.ReasonCommitRollback}},
		{"ErrTxCommitRollback with rollback tag", c, pgx.ErrTxCommitRollback, classifier.Facts{Server: classifier.ServerPostgreSQL, RollbackTag: true}, want{rolledBack, false, false, "", classifier.ReasonCommitRollback}},
		// ERROR-severity PgError
		{"ERROR 23505 deferred constraint", c, errUnique, none, want{rolledBack, false, false, "23505", classifier.ReasonConstraintViolation}},
		{"ERROR 23505 wrapped", c, fmt.Errorf("commit: %w", errUnique), none, want{rolledBack, false, false, "23505", classifier.ReasonConstraintViolation}},
		{"ERROR 40001 serialization", c, errSerialization, none, want{rolledBack, true, false, "40001", classifier.ReasonSerializationFailure}},
		{"ERROR 40001 wrapped", c, fmt.Errorf("commit: %w", errSerialization), none, want{rolledBack, true, false, "40001", classifier.ReasonSerializationFailure}},
		{"ERROR 40P01 deadlock", c, errDeadlock, none, want{rolledBack, true, false, "40P01", classifier.ReasonDeadlock}},
		{"ERROR 22023 other", c, errInvalidParam, none, want{rolledBack, false, false, "22023", classifier.ReasonServerError}},
		{"localized ERROR (FEHLER)", c, errErrorGerman, none, want{rolledBack, false, false, "23505", classifier.ReasonConstraintViolation}},
		{"old server ERROR without unlocalized severity", c, errErrorOldServer, none, want{rolledBack, true, false, "40001", classifier.ReasonSerializationFailure}},
		// FATAL / PANIC
		{"FATAL 57P01", c, errAdminShutdown, none, want{unknown, false, false, "57P01", classifier.ReasonServerFatal}},
		{"FATAL 57P01 wrapped", c, fmt.Errorf("commit: %w", errAdminShutdown), none, want{unknown, false, false, "57P01", classifier.ReasonServerFatal}},
		{"FATAL 57P02", c, errCrashShutdown, none, want{unknown, false, false, "57P02", classifier.ReasonServerFatal}},
		{"PANIC", c, errPanic, none, want{unknown, false, false, "XX000", classifier.ReasonServerFatal}},
		{"localized FATAL (SCHWERWIEGEND)", c, errFatalGerman, none, want{unknown, false, false, "57P01", classifier.ReasonServerFatal}},
		{"localized PANIC (PANIK)", c, errPanicGerman, none, want{unknown, false, false, "XX000", classifier.ReasonServerFatal}},
		{"old server FATAL without unlocalized severity", c, errFatalOldServer, none, want{unknown, false, false, "57P01", classifier.ReasonServerFatal}},
		{"FATAL whose SQLSTATE would be retryable", c, pgErr("FATAL", "FATAL", "40001"), none, want{unknown, false, false, "40001", classifier.ReasonServerFatal}},
		// connection lost, timeout, cancel after sending
		{"io.EOF", c, io.EOF, none, want{unknown, false, false, "", classifier.ReasonConnectionLost}},
		{"io.ErrUnexpectedEOF", c, io.ErrUnexpectedEOF, none, want{unknown, false, false, "", classifier.ReasonConnectionLost}},
		{"io.ErrUnexpectedEOF wrapped", c, fmt.Errorf("receive message failed: %w", io.ErrUnexpectedEOF), none, want{unknown, false, false, "", classifier.ReasonConnectionLost}},
		{"net.OpError", c, errNetOp, none, want{unknown, false, false, "", classifier.ReasonConnectionLost}},
		{"net.ErrClosed", c, net.ErrClosed, none, want{unknown, false, false, "", classifier.ReasonConnectionLost}},
		{"context.Canceled", c, context.Canceled, none, want{unknown, false, false, "", classifier.ReasonCanceled}},
		{"context.DeadlineExceeded", c, context.DeadlineExceeded, none, want{unknown, false, false, "", classifier.ReasonDeadlineExceeded}},
		{"context.DeadlineExceeded wrapped", c, fmt.Errorf("timeout: %w", context.DeadlineExceeded), none, want{unknown, false, false, "", classifier.ReasonDeadlineExceeded}},
		// conn closed with SafeToRetry true: was committed in a real run
		{"SafeToRetry true", c, retryableErr{safe: true}, none, want{unknown, false, false, "", ""}},
		{"SafeToRetry true wrapped", c, fmt.Errorf("commit: %w", retryableErr{safe: true}), none, want{unknown, false, false, "", ""}},
		{"SafeToRetry true with conn-closed fact", c, retryableErr{safe: true}, classifier.Facts{Server: classifier.ServerPostgreSQL, ConnClosed: true}, want{unknown, false, false, "", ""}},
		{"SafeToRetry false", c, retryableErr{safe: false}, none, want{unknown, false, false, "", ""}},
		{"plain error", c, errApp, none, want{unknown, false, false, "", ""}},
		// WARNING "already committed locally"
		{"committed locally + nil", c, nil, local, want{committed, false, true, "", classifier.ReasonCommitted}},
		{"committed locally + EOF", c, io.ErrUnexpectedEOF, local, want{unknown, false, true, "", classifier.ReasonConnectionLost}},
		{"committed locally + FATAL 57P01", c, errAdminShutdown, local, want{unknown, false, true, "57P01", classifier.ReasonServerFatal}},
		{"committed locally + net.OpError", c, errNetOp, local, want{unknown, false, true, "", classifier.ReasonConnectionLost}},
		{"committed locally + SafeToRetry", c, retryableErr{safe: true}, local, want{unknown, false, true, "", ""}},
		{"committed locally + canceled", c, context.Canceled, local, want{unknown, false, true, "", classifier.ReasonCanceled}},
	})
}

func TestClassifyActive(t *testing.T) {
	a := outcome.PhaseActive
	none := classifier.Facts{Server: classifier.ServerPostgreSQL}
	closed := classifier.Facts{Server: classifier.ServerPostgreSQL, ConnClosed: true}
	runClassifyCases(t, []classifyCase{
		{"nil", a, nil, none, want{rolledBack, false, false, "", classifier.ReasonRolledBack}},
		{"ERROR 40001", a, errSerialization, none, want{rolledBack, true, false, "40001", classifier.ReasonSerializationFailure}},
		{"ERROR 40001 wrapped", a, fmt.Errorf("query: %w", errSerialization), none, want{rolledBack, true, false, "40001", classifier.ReasonSerializationFailure}},
		{"ERROR 40P01", a, errDeadlock, none, want{rolledBack, true, false, "40P01", classifier.ReasonDeadlock}},
		{"ERROR 23505", a, errUnique, none, want{rolledBack, false, false, "23505", classifier.ReasonConstraintViolation}},
		{"ERROR 22023", a, errInvalidParam, none, want{rolledBack, false, false, "22023", classifier.ReasonServerError}},
		{"FATAL 57P01", a, errAdminShutdown, none, want{rolledBack, true, false, "57P01", classifier.ReasonServerFatal}},
		{"localized FATAL", a, errFatalGerman, none, want{rolledBack, true, false, "57P01", classifier.ReasonServerFatal}},
		{"PANIC", a, errPanic, none, want{rolledBack, true, false, "XX000", classifier.ReasonServerFatal}},
		{"io.EOF", a, io.EOF, none, want{rolledBack, true, false, "", classifier.ReasonConnectionLost}},
		{"io.ErrUnexpectedEOF", a, io.ErrUnexpectedEOF, none, want{rolledBack, true, false, "", classifier.ReasonConnectionLost}},
		{"net.OpError", a, errNetOp, none, want{rolledBack, true, false, "", classifier.ReasonConnectionLost}},
		{"net.OpError wrapped", a, fmt.Errorf("query: %w", errNetOp), none, want{rolledBack, true, false, "", classifier.ReasonConnectionLost}},
		{"net.ErrClosed", a, net.ErrClosed, none, want{rolledBack, true, false, "", classifier.ReasonConnectionLost}},
		{"SafeToRetry driver error", a, retryableErr{safe: true}, none, want{rolledBack, true, false, "", classifier.ReasonConnectionLost}},
		{"conn-closed fact + plain error", a, errors.New("boom"), closed, want{rolledBack, true, false, "", classifier.ReasonConnectionLost}},
		{"plain error", a, errApp, none, want{rolledBack, false, false, "", classifier.ReasonApplicationError}},
		{"plain error wrapped", a, fmt.Errorf("handler: %w", errApp), none, want{rolledBack, false, false, "", classifier.ReasonApplicationError}},
		{"context.Canceled", a, context.Canceled, none, want{rolledBack, false, false, "", classifier.ReasonCanceled}},
		{"context.Canceled with conn-closed fact", a, context.Canceled, closed, want{rolledBack, false, false, "", classifier.ReasonCanceled}},
		{"context.DeadlineExceeded", a, context.DeadlineExceeded, none, want{rolledBack, false, false, "", classifier.ReasonDeadlineExceeded}},
		{"ErrTxCommitRollback", a, pgx.ErrTxCommitRollback, none, want{rolledBack, false, false, "", ""}},
		{"committed-locally fact is ignored", a, io.EOF, classifier.Facts{Server: classifier.ServerPostgreSQL, CommittedLocally: true}, want{rolledBack, true, false, "", classifier.ReasonConnectionLost}},
	})
}

func TestClassifyNotStarted(t *testing.T) {
	n := outcome.PhaseNotStarted
	none := classifier.Facts{Server: classifier.ServerPostgreSQL}
	runClassifyCases(t, []classifyCase{
		{"nil", n, nil, none, want{rolledBack, false, false, "", classifier.ReasonRolledBack}},
		{"io.EOF", n, io.EOF, none, want{rolledBack, true, false, "", classifier.ReasonConnectionLost}},
		{"net.OpError", n, errNetOp, none, want{rolledBack, true, false, "", classifier.ReasonConnectionLost}},
		{"pgconn.ConnectError", n, &pgconn.ConnectError{}, none, want{rolledBack, true, false, "", classifier.ReasonConnectionLost}},
		{"SafeToRetry driver error", n, retryableErr{safe: true}, none, want{rolledBack, true, false, "", classifier.ReasonConnectionLost}},
		{"FATAL 57P01", n, errAdminShutdown, none, want{rolledBack, true, false, "57P01", classifier.ReasonServerFatal}},
		{"ERROR 22023", n, errInvalidParam, none, want{rolledBack, false, false, "22023", classifier.ReasonServerError}},
		{"ERROR 40001", n, errSerialization, none, want{rolledBack, true, false, "40001", classifier.ReasonSerializationFailure}},
		{"plain error", n, errApp, none, want{rolledBack, false, false, "", classifier.ReasonApplicationError}},
		{"context.DeadlineExceeded", n, context.DeadlineExceeded, none, want{rolledBack, false, false, "", classifier.ReasonDeadlineExceeded}},
	})
}

func TestClassifyTerminalPhases(t *testing.T) {
	none := classifier.Facts{Server: classifier.ServerPostgreSQL}
	local := classifier.Facts{Server: classifier.ServerPostgreSQL, CommittedLocally: true}
	var cases []classifyCase
	for _, e := range []struct {
		name string
		err  error
	}{
		{"nil", nil}, {"EOF", io.EOF}, {"ERROR 40001", errSerialization}, {"FATAL", errAdminShutdown},
		{"plain", errApp}, {"SafeToRetry", retryableErr{safe: true}}, {"canceled", context.Canceled},
	} {
		cases = append(cases,
			classifyCase{"committed/" + e.name, outcome.PhaseCommitted, e.err, none, want{committed, false, false, "", classifier.ReasonCommitted}},
			classifyCase{"committed/" + e.name + "/locally", outcome.PhaseCommitted, e.err, local, want{committed, false, true, "", classifier.ReasonCommitted}},
		)
	}
	cases = append(cases,
		classifyCase{"rolled_back/nil", outcome.PhaseRolledBack, nil, none, want{rolledBack, false, false, "", classifier.ReasonRolledBack}},
		classifyCase{"rolled_back/ERROR 40001 is not retryable", outcome.PhaseRolledBack, errSerialization, none, want{rolledBack, false, false, "40001", ""}},
		classifyCase{"rolled_back/EOF is not retryable", outcome.PhaseRolledBack, io.EOF, none, want{rolledBack, false, false, "", ""}},
		classifyCase{"rolled_back/FATAL is not retryable", outcome.PhaseRolledBack, errAdminShutdown, none, want{rolledBack, false, false, "57P01", ""}},
		classifyCase{"rolled_back/conn-closed fact", outcome.PhaseRolledBack, errApp, classifier.Facts{Server: classifier.ServerPostgreSQL, ConnClosed: true}, want{rolledBack, false, false, "", ""}},
		classifyCase{"unknown/nil", outcome.PhaseUnknown, nil, none, want{unknown, false, false, "", classifier.ReasonUnknown}},
		classifyCase{"unknown/nil/locally", outcome.PhaseUnknown, nil, local, want{unknown, false, true, "", classifier.ReasonUnknown}},
		classifyCase{"unknown/EOF", outcome.PhaseUnknown, io.EOF, none, want{unknown, false, false, "", classifier.ReasonUnknown}},
		classifyCase{"unknown/ERROR 40001 is not retryable", outcome.PhaseUnknown, errSerialization, none, want{unknown, false, false, "40001", classifier.ReasonUnknown}},
		classifyCase{"unknown/SafeToRetry", outcome.PhaseUnknown, retryableErr{safe: true}, none, want{unknown, false, false, "", classifier.ReasonUnknown}},
	)
	runClassifyCases(t, cases)
}

// TestClassifyUnknownOnlyWhileCommitting: neither the error alone nor the phase alone
// makes a completion unknown.
func TestClassifyUnknownOnlyWhileCommitting(t *testing.T) {
	errs := []error{nil, io.EOF, io.ErrUnexpectedEOF, errNetOp, errAdminShutdown, errPanic, errFatalGerman,
		context.Canceled, context.DeadlineExceeded, retryableErr{true}, retryableErr{false}, errApp,
		errSerialization, errUnique, pgx.ErrTxCommitRollback}
	for _, p := range []outcome.Phase{outcome.PhaseNotStarted, outcome.PhaseActive, outcome.PhaseCommitted, outcome.PhaseRolledBack, 6, 255} {
		for _, err := range errs {
			for _, f := range allFacts() {
				v := classifier.Classify(p, err, f)
				if v.Evidence() == unknown {
					t.Errorf("Classify(%v, %v, %+v) = unknown outside committing", p, err, f)
				}
			}
		}
	}
}

func allFacts() []classifier.Facts {
	var fs []classifier.Facts
	for bits := range 8 {
		fs = append(fs, factsFromBits(byte(bits)))
	}
	return fs
}

// factsFromBits makes facts from the low bits of b; bits 3 and 4 choose the server,
// PostgreSQL for 0, so that b < 8 is a PostgreSQL server.
func factsFromBits(b byte) classifier.Facts {
	servers := [...]classifier.ServerKind{classifier.ServerPostgreSQL, classifier.ServerUnknown, classifier.ServerCockroachDB, classifier.ServerOther}
	return classifier.Facts{Server: servers[b>>3&3], RollbackTag: b&1 != 0, CommittedLocally: b&2 != 0, ConnClosed: b&4 != 0}
}

func TestEvidenceString(t *testing.T) {
	tests := []struct {
		e    classifier.Evidence
		want string
	}{
		{classifier.EvidenceCommitted, "committed"},
		{classifier.EvidenceRolledBack, "rolled_back"},
		{classifier.EvidenceUnknown, "unknown"},
		{0, "evidence(0)"},
		{4, "evidence(4)"},
	}
	for _, tt := range tests {
		if got := tt.e.String(); got != tt.want {
			t.Errorf("Evidence(%d).String() = %q, want %q", uint8(tt.e), got, tt.want)
		}
	}
	// The evidence names match the terminal phase names.
	for _, e := range []classifier.Evidence{committed, rolledBack, unknown} {
		p, err := outcome.ParsePhase(e.String())
		if err != nil || !p.Terminal() {
			t.Errorf("Evidence %v is not a terminal phase name (%v, %v)", e, p, err)
		}
	}
}

func TestNewClassification(t *testing.T) {
	tests := []struct {
		name      string
		evidence  classifier.Evidence
		retryable bool
		wantErr   bool
	}{
		{"committed", committed, false, false},
		{"rolled_back", rolledBack, false, false},
		{"rolled_back retryable", rolledBack, true, false},
		{"unknown", unknown, false, false},
		{"unknown retryable", unknown, true, true},
		{"committed retryable", committed, true, true},
		{"zero evidence", 0, false, true},
		{"zero evidence retryable", 0, true, true},
		{"evidence 4", 4, false, true},
		{"evidence 255", 255, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := classifier.NewClassification(tt.evidence, tt.retryable, "40001", "reason")
			if tt.wantErr {
				if err == nil {
					t.Fatalf("NewClassification(%v, %v) = %+v, nil; want error", tt.evidence, tt.retryable, v)
				}
				if v != (classifier.Classification{}) {
					t.Errorf("refused NewClassification returned non-zero classification %+v", v)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewClassification(%v, %v) error: %v", tt.evidence, tt.retryable, err)
			}
			if v.Evidence() != tt.evidence || v.Retryable() != tt.retryable || v.SQLState() != "40001" || v.Reason() != "reason" {
				t.Errorf("NewClassification = {%v %v %q %q}", v.Evidence(), v.Retryable(), v.SQLState(), v.Reason())
			}
			if v.CommittedLocally() {
				t.Error("NewClassification set CommittedLocally")
			}
		})
	}
}

func TestNewClassificationUnknownRetryableMessage(t *testing.T) {
	_, err := classifier.NewClassification(unknown, true, "", "")
	if err == nil {
		t.Fatal("want error")
	}
	for _, s := range []string{"unknown", "retryable"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func TestZeroVerdictIsNoVerdict(t *testing.T) {
	var v classifier.Classification
	switch v.Evidence() {
	case committed, rolledBack, unknown:
		t.Errorf("zero Verdict has evidence %v", v.Evidence())
	}
}

// A proxy such as PgBouncer reports a lost server connection as an ERROR of class 08,
// possibly after the server committed: that is no evidence of rollback.
func TestClassifyConnectionClassErrorWhileCommitting(t *testing.T) {
	err := &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "08P01", Message: "server conn crashed?"}
	v := classifier.Classify(outcome.PhaseCommitting, err, classifier.Facts{Server: classifier.ServerPostgreSQL})
	if v.Evidence() != classifier.EvidenceUnknown || v.Retryable() || v.SQLState() != "08P01" {
		t.Fatalf("got %v retryable=%v sqlstate=%q, want unknown, not retryable, 08P01", v.Evidence(), v.Retryable(), v.SQLState())
	}
	if v := classifier.Classify(outcome.PhaseActive, err, classifier.Facts{Server: classifier.ServerPostgreSQL}); v.Evidence() != classifier.EvidenceRolledBack {
		t.Fatalf("before COMMIT a class 08 error is a rollback, got %v", v.Evidence())
	}
}

// TestClassifyAbortedBeforeCommit: an ERROR in reply to the call ahead of COMMIT, in
// COMMIT's write, makes a COMMIT whose reply was lost a rollback with that error's
// reason (a serialization failure is retryable); not a FATAL (its own rule), not class 08
// (a proxy's), not against a "committed locally" warning, not on another server.
func TestClassifyAbortedBeforeCommit(t *testing.T) {
	c := outcome.PhaseCommitting
	pg := classifier.ServerPostgreSQL
	lockTimeout := pgErr("ERROR", "ERROR", "55P03")
	runClassifyCases(t, []classifyCase{
		{"lock timeout", c, errNetOp, classifier.Facts{Server: pg, AbortedBeforeCommit: lockTimeout, ConnClosed: true},
			want{evidence: classifier.EvidenceRolledBack, sqlstate: "55P03", reason: classifier.ReasonServerError}},
		{"serialization failure", c, errNetOp, classifier.Facts{Server: pg, AbortedBeforeCommit: errSerialization},
			want{evidence: classifier.EvidenceRolledBack, retryable: true, sqlstate: "40001", reason: classifier.ReasonSerializationFailure}},
		{"a FATAL is not this rule's", c, errNetOp, classifier.Facts{Server: pg, AbortedBeforeCommit: errAdminShutdown},
			want{evidence: classifier.EvidenceUnknown, reason: classifier.ReasonConnectionLost}},
		{"class 08 is a proxy's", c, errNetOp, classifier.Facts{Server: pg, AbortedBeforeCommit: pgErr("ERROR", "ERROR", "08P01")},
			want{evidence: classifier.EvidenceUnknown, reason: classifier.ReasonConnectionLost}},
		{"committed locally contradicts it", c, errNetOp, classifier.Facts{Server: pg, AbortedBeforeCommit: lockTimeout, CommittedLocally: true},
			want{evidence: classifier.EvidenceUnknown, committedLocally: true, reason: classifier.ReasonConnectionLost}},
		{"another server", c, errNetOp, classifier.Facts{Server: classifier.ServerOther, AbortedBeforeCommit: lockTimeout},
			want{evidence: classifier.EvidenceUnknown, reason: classifier.ReasonConnectionLost}},
		{"not an error of the server's", c, errNetOp, classifier.Facts{Server: pg, AbortedBeforeCommit: errNetOp},
			want{evidence: classifier.EvidenceUnknown, reason: classifier.ReasonConnectionLost}},
	})
}

// TestClassifyCommitNotExecuted: the facts that prove a failed COMMIT never ran make it a
// retryable rollback, only with the connection gone (a COMMIT refused locally left a
// transaction that could still commit), never against a "committed locally" warning;
// the idle-in-transaction timeout's FATAL proves it by itself.
func TestClassifyCommitNotExecuted(t *testing.T) {
	c := outcome.PhaseCommitting
	idle := pgErr("FATAL", "FATAL", codeIdleInTransactionTimeout)
	runClassifyCases(t, []classifyCase{
		{"not sent, conn closed", c, errNetOp, classifier.Facts{Server: classifier.ServerPostgreSQL, CommitNotSent: true, ConnClosed: true},
			want{evidence: classifier.EvidenceRolledBack, retryable: true, reason: classifier.ReasonCommitNotSent}},
		{"not sent, conn open", c, retryableErr{}, classifier.Facts{Server: classifier.ServerPostgreSQL, CommitNotSent: true},
			want{evidence: classifier.EvidenceUnknown, reason: classifier.ReasonConnectionLost}},
		{"FATAL before COMMIT", c, errAdminShutdown, classifier.Facts{Server: classifier.ServerPostgreSQL, SessionEndedBeforeCommit: true, ConnClosed: true},
			want{evidence: classifier.EvidenceRolledBack, retryable: true, sqlstate: "57P01", reason: classifier.ReasonSessionEndedBeforeCommit}},
		{"FATAL after COMMIT was written", c, errAdminShutdown, classifier.Facts{Server: classifier.ServerPostgreSQL, ConnClosed: true},
			want{evidence: classifier.EvidenceUnknown, sqlstate: "57P01", reason: classifier.ReasonServerFatal}},
		{"committed locally wins", c, errAdminShutdown, classifier.Facts{Server: classifier.ServerPostgreSQL, SessionEndedBeforeCommit: true, CommitNotSent: true, ConnClosed: true, CommittedLocally: true},
			want{evidence: classifier.EvidenceUnknown, committedLocally: true, sqlstate: "57P01"}},
		{"idle in transaction timeout", c, idle, classifier.Facts{Server: classifier.ServerPostgreSQL},
			want{evidence: classifier.EvidenceRolledBack, retryable: true, sqlstate: "25P03", reason: classifier.ReasonIdleInTransactionTimeout}},
		{"idle_session_timeout is no proof", c, pgErr("FATAL", "FATAL", "57P05"), classifier.Facts{Server: classifier.ServerPostgreSQL, ConnClosed: true},
			want{evidence: classifier.EvidenceUnknown, sqlstate: "57P05"}},
	})
}
