package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/trace"

	"github.com/txevidence/otelpgxtx/internal/schema"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

// readItems parses the arguments, or standard input when there are none, and returns
// the items with a message for each input that is not one.
func readItems(args []string, stdin io.Reader) (items []item, bad []string) {
	add := func(where, text string) {
		text = strings.TrimSpace(text)
		if text == "" {
			return
		}
		it, err := parseItem(text)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", where, err))
			return
		}
		items = append(items, it)
	}
	if len(args) > 0 {
		for i, a := range args {
			add(fmt.Sprintf("argument %d", i+1), a)
		}
		for i := range items {
			items[i].argument = true
		}
	} else {
		sc := bufio.NewScanner(stdin)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		for n := 1; sc.Scan(); n++ {
			add(fmt.Sprintf("line %d", n), sc.Text())
		}
		if err := sc.Err(); err != nil {
			bad = append(bad, fmt.Sprintf("reading standard input: %v", err))
		}
	}
	return items, bad
}

// item is one thing to reconcile: a reference, and the operation id and span it came with.
type item struct {
	ref    outcome.ReconciliationRef
	hasRef bool
	// argument: given on the command line; record: a JSON log record.
	argument, record bool
	// byMarker: settled by the -assert-marker table alone.
	byMarker bool
	op       outcome.OperationID
	link     trace.SpanContext
	// recovery is the end of a crash recovery (MessageCrashRecovered's record): nothing to
	// answer, evidence for the references (reconcile.Reconciler.Remember).
	recovery *reconcile.Recovery
}

// asserted reports whether -assert-marker applies to it: a bare operation id given as an
// argument (never one read from standard input, nor one that came with a reference).
func (it item) asserted() bool { return it.argument && !it.record && !it.hasRef }

// dedupe answers each transaction once, whatever the input repeats: a log query returns
// both the indeterminate record and the pending-at-shutdown record of one operation, and
// a reference may come alone and in a record. Items are one transaction when they have the
// same reference, or the same operation id and at most one of them a reference; the first
// keeps its place and gains what the others add (a reference, an operation id, a span).
func dedupe(items []item) []item {
	var out []item
	for _, it := range items {
		i := slices.IndexFunc(out, it.sameTransaction)
		if i < 0 {
			out = append(out, it)
			continue
		}
		o := &out[i]
		if !o.hasRef && it.hasRef {
			o.ref, o.hasRef = it.ref, true
		}
		if o.op.IsZero() {
			o.op = it.op
		}
		if !o.link.IsValid() {
			o.link = it.link
		}
	}
	return out
}

// sameTransaction reports whether it and o stand for one transaction (see dedupe).
func (it item) sameTransaction(o item) bool {
	if it.hasRef && o.hasRef {
		return it.ref.String() == o.ref.String()
	}
	return !it.op.IsZero() && it.op == o.op
}

// line formats the answer for it, in one format whatever the input: "-" stands for what
// the input did not give.
func (it item) line(res reconcile.Answer) string {
	ref, op := "-", "-"
	if it.hasRef {
		ref = it.ref.String()
	}
	switch {
	case !it.op.IsZero():
		op = it.op.String()
	case it.ref.HasMarker():
		op = it.ref.Operation.String()
	}
	var b strings.Builder
	b.WriteString("ref=" + ref + " operation=" + op + " resolved=" + res.Status().String())
	switch {
	case !it.hasRef && !it.byMarker:
		b.WriteString(" reason=" + reconcile.ReasonNoReference)
	case res.Reason() != "":
		b.WriteString(" reason=" + res.Reason())
	}
	return b.String()
}

// parseItem reads a reference, an operation id, or a JSON log record carrying them.
func parseItem(text string) (item, error) {
	if u, err := strconv.Unquote(text); err == nil && strings.HasPrefix(text, `"`) {
		text = u // as slog's text handler writes a reference: quoted, for its ";" and "="
	}
	switch {
	case strings.HasPrefix(text, "{"):
		return parseRecord(text)
	case strings.HasPrefix(text, "pg:"):
		ref, err := outcome.ParseReconciliationRef(text)
		return item{ref: ref, hasRef: true}, err
	case strings.HasPrefix(text, "pgrecovery:"):
		rec, err := reconcile.ParseRecovery(text)
		return item{recovery: &rec}, err
	}
	op, err := outcome.ParseOperationID(text)
	if err != nil {
		return item{}, fmt.Errorf("%q is neither a reconciliation reference (pg:<system identifier>/<timeline>/<xid8>[/<server start>]), "+
			"an operation id (32 hex digits) nor a JSON log record", text)
	}
	return item{op: op}, nil
}

// parseRecord reads one of the library's JSON log records.
func parseRecord(text string) (item, error) {
	var rec map[string]any
	if err := json.Unmarshal([]byte(text), &rec); err != nil {
		return item{}, fmt.Errorf("not a JSON log record: %v", err)
	}
	str := func(k string) string { s, _ := rec[k].(string); return s }
	it := item{record: true}
	if s := str(string(schema.RecoveryKey)); s != "" {
		r, err := reconcile.ParseRecovery(s)
		if err != nil {
			return item{}, fmt.Errorf("%s: %w", schema.RecoveryKey, err)
		}
		return item{record: true, recovery: &r}, nil
	}
	ref, op := str(string(schema.ReconciliationRefKey)), str(string(schema.OperationIDKey))
	if ref == "" && op == "" {
		return item{}, fmt.Errorf("the JSON record has neither %s nor %s", schema.ReconciliationRefKey, schema.OperationIDKey)
	}
	if ref != "" {
		r, err := outcome.ParseReconciliationRef(ref)
		if err != nil {
			return item{}, err
		}
		it.ref, it.hasRef = r, true
	}
	if op != "" {
		id, err := outcome.ParseOperationID(op)
		if err != nil {
			return item{}, fmt.Errorf("%s: %w", schema.OperationIDKey, err)
		}
		it.op = id
	}
	tid, err1 := trace.TraceIDFromHex(str(schema.TraceIDLogKey))
	sid, err2 := trace.SpanIDFromHex(str(schema.SpanIDLogKey))
	if err1 == nil && err2 == nil {
		it.link = trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	}
	return it, nil
}
