package otelpgxtx

import (
	"github.com/jackc/pgx/v5"

	"github.com/txevidence/otelpgxtx/internal/markertable"
	"github.com/txevidence/otelpgxtx/internal/reference"
	"github.com/txevidence/otelpgxtx/internal/settings"
)

// WithCommitReference gives plain pgx and database/sql transactions — pool.Begin …
// Commit, pgx.BeginFunc, BeginTx, stdlib, a raw begin … commit — the commit reference
// [Run] gives its own (Policy.CommitReference), by the one mechanism both use: the xid
// read (a fast-path call of pg_current_xact_id_if_assigned) is added after the
// transaction's first statement that may write, in that statement's own write, so it
// costs no round trip and the xid is on the client before COMMIT is written; its reply,
// which follows the statement's, is taken out of the stream: pgconn reads exactly its own
// replies. COMMIT then carries nothing of the library's. An indeterminate frame carries
// tx.reconciliation.ref, for its log record, automatic reconciliation and the operator's
// command — also when the connection was lost after COMMIT was written, or before it
// reached the server.
//
// What it needs is checked once per connection, outside any transaction, ahead of the
// first BEGIN in the same write (the cluster identity, and the privilege to call the
// function): a check that fails turns it off for that connection, with one log record.
// Only PostgreSQL servers get it. The read is added only after a lone statement that may
// write and cannot wait for the client's data (not a SELECT, SHOW, SET, … nor COPY),
// executed by a write that ends where the server answers and reads on (a Query, or the
// extended protocol's Sync); where none was, it goes ahead of a lone simple-protocol
// COMMIT, in its write, as before. Nothing is added to a read-only transaction, one that
// wrote nothing the library saw, nor, with a context watcher that sends cancel requests
// (pgconn's default sets a deadline instead), after a statement whose context can be
// cancelled: a cancel sent for the statement could land on the read and abort the
// transaction. docs/reconciliation.md ("Plain pgx and database/sql") says what it sends;
// docs/performance.md what it costs.
func WithCommitReference() Option {
	return optionFunc(func(c *settings.Config) {
		if c.Reference == reference.None {
			c.Reference = reference.XID
		}
	})
}

// WithCommitMarker is [WithCommitReference] with a commit marker: in place of the xid
// read, the call ahead of the application's COMMIT, in the same write, is the marker
// function of table, schema and table (pgx.Identifier{"app", "tx_marker"}; an unqualified
// name is refused; create both with reconcile.MarkerTableDDL), which inserts the frame's
// operation id, so that the reference names a row that exists exactly when the
// transaction committed, even after a crash restart or a failover, and is settled even
// when no reply came. The function is called by its schema-qualified name (so that one
// dropped and created again, by a migration or a restore, is found) and runs as its owner
// (SECURITY DEFINER), so what the application's transaction does — SET ROLE,
// search_path, row security — changes nothing of it, and it writes nothing in a read-only
// transaction or one without writes,
// which leave nothing durable to mark: a commit with the marker does and answers exactly
// what it does without. The reference names the database and the table it wrote to. The
// function is checked with the cluster identity; where it is missing or not callable by
// every role, the connection's commits carry the xid read alone, with one log record.
func WithCommitMarker(table pgx.Identifier) Option {
	return optionFunc(func(c *settings.Config) {
		name, err := markertable.Quote(table...)
		if err != nil {
			refuse(&c.Err, invalid("WithCommitMarker: %w", err))
			return
		}
		c.Reference, c.Marker = reference.Marker, name
	})
}
