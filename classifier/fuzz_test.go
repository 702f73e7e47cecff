package classifier_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx/classifier"
	"github.com/txevidence/otelpgxtx/outcome"
)

// Error shapes the fuzz target can build.
const (
	shapeNil = iota
	shapePgError
	shapeWrappedPgError
	shapeEOF
	shapeUnexpectedEOF
	shapeCanceled
	shapeDeadlineExceeded
	shapeSafeToRetryTrue
	shapeSafeToRetryFalse
	shapePlain
	shapeCommitRollback
	shapeWrappedCommitRollback
	shapeNetOp
	shapeCount
)

func fuzzError(shape byte, sqlstate, severity, unlocalized string) (pg *pgconn.PgError, err error) {
	switch shape % shapeCount {
	case shapeNil:
		return nil, nil
	case shapePgError:
		pg = &pgconn.PgError{Severity: severity, SeverityUnlocalized: unlocalized, Code: sqlstate}
		return pg, pg
	case shapeWrappedPgError:
		pg = &pgconn.PgError{Severity: severity, SeverityUnlocalized: unlocalized, Code: sqlstate}
		return pg, fmt.Errorf("wrapped: %w", pg)
	case shapeEOF:
		return nil, io.EOF
	case shapeUnexpectedEOF:
		return nil, fmt.Errorf("receive message: %w", io.ErrUnexpectedEOF)
	case shapeCanceled:
		return nil, context.Canceled
	case shapeDeadlineExceeded:
		return nil, fmt.Errorf("timeout: %w", context.DeadlineExceeded)
	case shapeSafeToRetryTrue:
		return nil, retryableErr{safe: true}
	case shapeSafeToRetryFalse:
		return nil, retryableErr{safe: false}
	case shapePlain:
		return nil, errors.New(sqlstate + severity)
	case shapeCommitRollback:
		return nil, pgx.ErrTxCommitRollback
	case shapeWrappedCommitRollback:
		return nil, fmt.Errorf("commit: %w", pgx.ErrTxCommitRollback)
	case shapeNetOp:
		return nil, errNetOp
	}
	panic("unreachable")
}

func FuzzClassify(f *testing.F) {
	f.Add(byte(outcome.PhaseCommitting), byte(shapeNil), "", "", "", byte(0))
	f.Add(byte(outcome.PhaseCommitting), byte(shapeNil), "", "", "", byte(1))                            // ROLLBACK tag
	f.Add(byte(outcome.PhaseCommitting), byte(shapeNil), "", "", "", byte(2))                            // committed locally
	f.Add(byte(outcome.PhaseCommitting), byte(shapePgError), "40001", "ERROR", "ERROR", byte(0))         // SSI
	f.Add(byte(outcome.PhaseCommitting), byte(shapePgError), "23505", "FEHLER", "ERROR", byte(0))        // localized ERROR
	f.Add(byte(outcome.PhaseCommitting), byte(shapeWrappedPgError), "57P01", "FATAL", "FATAL", byte(2))  // terminated in sync-rep wait
	f.Add(byte(outcome.PhaseCommitting), byte(shapePgError), "57P01", "SCHWERWIEGEND", "FATAL", byte(0)) // localized FATAL
	f.Add(byte(outcome.PhaseCommitting), byte(shapePgError), "XX000", "PANIC", "", byte(0))              // old server PANIC
	f.Add(byte(outcome.PhaseCommitting), byte(shapeSafeToRetryTrue), "", "", "", byte(4))                // conn closed, SafeToRetry
	f.Add(byte(outcome.PhaseCommitting), byte(shapeEOF), "", "", "", byte(0))
	f.Add(byte(outcome.PhaseCommitting), byte(shapeWrappedCommitRollback), "", "", "", byte(0))
	f.Add(byte(outcome.PhaseActive), byte(shapePgError), "40P01", "ERROR", "ERROR", byte(0))
	f.Add(byte(outcome.PhaseActive), byte(shapePlain), "app", "", "", byte(4))
	f.Add(byte(outcome.PhaseActive), byte(shapeCanceled), "", "", "", byte(4))
	f.Add(byte(outcome.PhaseNotStarted), byte(shapeNetOp), "", "", "", byte(0))
	f.Add(byte(outcome.PhaseCommitted), byte(shapeEOF), "", "", "", byte(2))
	f.Add(byte(outcome.PhaseRolledBack), byte(shapePgError), "40001", "ERROR", "ERROR", byte(0))
	f.Add(byte(outcome.PhaseUnknown), byte(shapeNil), "", "", "", byte(7))
	f.Add(byte(200), byte(shapeDeadlineExceeded), "", "", "", byte(0))                            // invalid phase
	f.Add(byte(outcome.PhaseCommitting), byte(shapePgError), "40003", "ERROR", "ERROR", byte(0))  // completion unknown, PostgreSQL
	f.Add(byte(outcome.PhaseCommitting), byte(shapePgError), "40003", "ERROR", "ERROR", byte(16)) // CockroachDB's "result is ambiguous"
	f.Add(byte(outcome.PhaseCommitting), byte(shapePgError), "XXA00", "ERROR", "ERROR", byte(16)) // CockroachDB: committed, schema change failed
	f.Add(byte(outcome.PhaseCommitting), byte(shapePgError), "40001", "ERROR", "ERROR", byte(24)) // another server's serialization failure
	f.Add(byte(outcome.PhaseCommitting), byte(shapePgError), "25P03", "FATAL", "FATAL", byte(12)) // idle timeout's code, unidentified server

	f.Fuzz(func(t *testing.T, phaseB, shape byte, sqlstate, severity, unlocalized string, bits byte) {
		phase := outcome.Phase(phaseB)
		facts := factsFromBits(bits)
		pg, err := fuzzError(shape, sqlstate, severity, unlocalized)
		v := classifier.Classify(phase, err, facts)
		ev := v.Evidence()
		ctx := func() string {
			return fmt.Sprintf("Classify(%v, %v [shape %d], %+v) = {%v retryable=%v local=%v sqlstate=%q reason=%q}",
				phase, err, shape%shapeCount, facts, ev, v.Retryable(), v.CommittedLocally(), v.SQLState(), v.Reason())
		}

		// Evidence is always one of three.
		if ev != classifier.EvidenceCommitted && ev != classifier.EvidenceRolledBack && ev != classifier.EvidenceUnknown {
			t.Fatalf("invalid evidence: %s", ctx())
		}
		// Unknown only while committing, or when the phase already says unknown.
		if ev == classifier.EvidenceUnknown && phase != outcome.PhaseCommitting && phase != outcome.PhaseUnknown {
			t.Fatalf("unknown outside committing: %s", ctx())
		}
		// Unknown is never retryable; neither is committed.
		if ev == classifier.EvidenceUnknown && v.Retryable() {
			t.Fatalf("unknown and retryable: %s", ctx())
		}
		if ev == classifier.EvidenceCommitted && v.Retryable() {
			t.Fatalf("committed and retryable: %s", ctx())
		}
		// Committed only from committing with nil err, or from phase committed.
		if ev == classifier.EvidenceCommitted &&
			!(phase == outcome.PhaseCommitting && err == nil) && phase != outcome.PhaseCommitted {
			t.Fatalf("committed without commit evidence: %s", ctx())
		}
		// The classification must be one NewClassification accepts, with a reason.
		if _, nerr := classifier.NewClassification(ev, v.Retryable(), v.SQLState(), v.Reason()); nerr != nil {
			t.Fatalf("NewClassification refuses Classify's classification (%v): %s", nerr, ctx())
		}
		if v.Reason() == "" {
			t.Fatalf("empty reason: %s", ctx())
		}
		// The committed-locally fact is never invented, and never decorates a rollback.
		if v.CommittedLocally() && (!facts.CommittedLocally || ev == classifier.EvidenceRolledBack) {
			t.Fatalf("committed-locally without the fact or on a rollback: %s", ctx())
		}
		// A SQLSTATE is only reported from a server error that carries it.
		if v.SQLState() != "" && (pg == nil || pg.Code != v.SQLState()) {
			t.Fatalf("SQLSTATE not from the error: %s", ctx())
		}

		// Per-phase expectations.
		switch phase {
		case outcome.PhaseCommitted:
			if ev != classifier.EvidenceCommitted {
				t.Fatalf("phase committed not committed: %s", ctx())
			}
		case outcome.PhaseRolledBack:
			if ev != classifier.EvidenceRolledBack || v.Retryable() {
				t.Fatalf("phase rolled_back must be a non-retryable rollback: %s", ctx())
			}
		case outcome.PhaseUnknown:
			if ev != classifier.EvidenceUnknown {
				t.Fatalf("phase unknown not unknown: %s", ctx())
			}
		case outcome.PhaseCommitting:
			switch s := shape % shapeCount; {
			case s == shapeNil && !facts.RollbackTag:
				if ev != classifier.EvidenceCommitted {
					t.Fatalf("nil in committing not committed: %s", ctx())
				}
			case s == shapeNil, s == shapeCommitRollback, s == shapeWrappedCommitRollback:
				if ev != classifier.EvidenceRolledBack || v.Retryable() {
					t.Fatalf("ROLLBACK reply must be a non-retryable rollback: %s", ctx())
				}
			case s == shapePgError, s == shapeWrappedPgError:
				sev := unlocalized
				if sev == "" {
					sev = severity
				}
				fatal := sev == "FATAL" || sev == "PANIC"
				class := ""
				if len(sqlstate) == 5 {
					class = sqlstate[:2]
				}
				postgres := facts.Server == classifier.ServerPostgreSQL
				// An ERROR proves a rollback on PostgreSQL, which cannot raise one after its
				// commit record; elsewhere only the standard's class 40 does. Never 40003
				// (completion unknown) nor class 08 (a proxy's). A FATAL proves one only as
				// PostgreSQL's idle-in-transaction timeout.
				var rolledBack, retry bool
				switch {
				case fatal:
					rolledBack = sqlstate == "25P03" && postgres && !facts.CommittedLocally
					retry = rolledBack
				case sqlstate == "40003" || class == "08":
				default:
					rolledBack = postgres || class == "40"
					retry = sqlstate == "40001" || sqlstate == "40P01"
				}
				if rolledBack != (ev == classifier.EvidenceRolledBack) || ev == classifier.EvidenceCommitted {
					t.Fatalf("server error severity %q on %v: %s", sev, facts.Server, ctx())
				}
				if rolledBack && v.Retryable() != retry {
					t.Fatalf("server error in committing, retryable: %s", ctx())
				}
				if v.SQLState() != sqlstate {
					t.Fatalf("SQLSTATE lost: %s", ctx())
				}
			default:
				// EOF, context errors, SafeToRetry (true or false), plain errors, socket errors.
				if ev != classifier.EvidenceUnknown {
					t.Fatalf("failure in committing not unknown: %s", ctx())
				}
			}
		default: // not_started, active and invalid phases: the transaction cannot have committed
			if ev != classifier.EvidenceRolledBack {
				t.Fatalf("before commit not rolled back: %s", ctx())
			}
		}
	})
}
