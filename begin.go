package otelpgxtx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/frame"
	"github.com/txevidence/otelpgxtx/internal/pg"
)

// Begin begins a transaction on db and returns a context that carries its frame, with
// the frame span as the active span. A transaction begun with that context on another
// connection suspends this one: its frame is one level deeper and its span a child of
// this frame's span, which records tx.suspended and tx.resumed around it.
//
// db must be instrumented (see [InstrumentPool]); otherwise the transaction is begun
// and ctx is returned as it was. A nil db, or a nil *pgxpool.Pool or *pgx.Conn, is an
// error wrapping [ErrInvalidArgument].
func Begin(ctx context.Context, db DB, txOptions pgx.TxOptions) (context.Context, pgx.Tx, error) {
	if ctx == nil {
		return nil, nil, invalid("Begin: nil context")
	}
	if db == nil {
		return ctx, nil, invalid("Begin: nil db")
	}
	if pg.IsNilHandle(db) {
		return ctx, nil, invalid("Begin: nil %T", db)
	}
	tx, err := db.BeginTx(ctx, txOptions)
	if err != nil {
		return ctx, nil, err
	}
	if f, _ := frame.FrameOfTx(tx); f != nil {
		ctx = trace.ContextWithSpan(frame.ContextWithFrame(ctx, f), f.OTel)
	}
	return ctx, tx, nil
}

// DB is what [Run] and [Begin] begin transactions on: *pgxpool.Pool and *pgx.Conn are.
// With a pool, Run acquires a connection itself, so that its Policy's commit references
// reach the tracer of that connection; any other DB is used through BeginTx and Tx.Commit,
// without references.
type DB interface {
	BeginTx(ctx context.Context, txOptions pgx.TxOptions) (pgx.Tx, error)
}
