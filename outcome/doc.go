// Package outcome holds the outcome algebra of a PostgreSQL transaction as Go types:
// the evidence [Phase] of a physical transaction, the five [Outcome] values that the
// tracer writes as tx.outcome, and the sealed [Result] that the executor returns.
//
// Two sentences hold the whole algebra: a participant result never claims commit; an
// indeterminate result never grants replay authority. The types enforce both: there is
// no way to build a [Participating] that says committed, and [Indeterminate] has no
// retry field at all.
package outcome
