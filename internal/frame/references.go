package frame

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/txevidence/otelpgxtx/internal/evidence"
	"github.com/txevidence/otelpgxtx/internal/reference"
	"github.com/txevidence/otelpgxtx/internal/schema"
)

// Commit references, for plain pgx ([WithCommitReference], [WithCommitMarker]) and [Run]
// alike: what the tracer adds to the application's writes, through the connection's
// net.Conn wrapper, and what it makes of the replies, are package reference's; this file
// hands it each statement and records what it brought. A frame carries what its
// references are (the tracer's options, or Run's Policy for a transaction Run begins).

// RefStatement is what the references need of the statement sql, of kinds set, on pg.
func RefStatement(set evidence.Set, sql string, pg *pgconn.PgConn) reference.Statement {
	return reference.Statement{SQL: sql, Single: set.Single(), Writes: set.Writes(), Plain: set.Kinds() == evidence.OtherSet,
		Opens: !set.Single() && set.Kinds() == 1<<evidence.Begin, Commit: set.Decides(), InTx: pg.TxStatus() == 'T', Inside: set.CommitsInside()}
}

// ArmCheck has the write of f's BEGIN (sql, of kinds set) carry the check of what f's
// references need that the connection has not checked yet (reference.Conn.ArmCheck).
func (t *Core) ArmCheck(st *Conn, f *Frame, pg *pgconn.PgConn, set evidence.Set, sql string) {
	t.ReferenceOff(st.Refs.ArmCheck(f.CommitRef.Refs(), pg.ParameterStatus("server_version"), set.Single(), sql))
}

// ReferenceOff writes one record about the connection's references being off, if off
// says they are: what it holds is the library's own (SQLSTATEs, the table name the
// application configured), never user data.
func (t *Core) ReferenceOff(off *reference.Off) {
	if off != nil {
		t.Cfg.Logger().LogAttrs(context.Background(), slog.LevelWarn, "otelpgxtx: "+off.What, slog.String("reason", off.Why))
	}
}

// SawCheck keeps what st's check, just answered, saw of a crash recovery: one log record
// per recovery, and automatic reconciliation's reconciler told of it.
func (t *Core) SawCheck(st *Conn) {
	rec, ok := t.recoveries.Saw(st.Refs.Checkpoint())
	if !ok {
		return
	}
	t.Cfg.Logger().LogAttrs(context.Background(), slog.LevelWarn, schema.MessageCrashRecovered, slog.String(string(schema.RecoveryKey), rec.String()))
	if t.Auto != nil {
		t.Auto.R.Remember(rec)
	}
}
