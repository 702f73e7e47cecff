package wire

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/txevidence/otelpgxtx/internal/pg"
)

// LibraryMessage is what the library added to a write, and so which part of the server's
// reply is the library's.
type LibraryMessage uint8

const (
	// LibraryQuery: a Query; its reply is a row (or none) and its command tag, or an
	// ErrorResponse, up to its ReadyForQuery.
	LibraryQuery LibraryMessage = iota + 1
	// LibraryCall: a FunctionCall; its reply is a FunctionCallResponse (or an
	// ErrorResponse) and a ReadyForQuery.
	LibraryCall
	// LibraryPortal: extended-protocol messages without a Sync — Parse, Bind and Execute
	// of a statement of the library's, and a Flush — after the application's, before
	// their Sync (Addition.Extended); its reply, after their last Execute's completion,
	// is ParseComplete, BindComplete, a row and its command tag, or an ErrorResponse: in
	// that place an error is the implicit transaction's (PostgreSQL puts a failed
	// commit's there), and goes to pgconn.
	LibraryPortal
)

// Reply is what the server answered to the library's message.
type Reply struct {
	Row      [][]byte // the DataRow's values (LibraryQuery); nil if none came
	Value    []byte   // the FunctionCallResponse's result, or a one-column row's value; nil for NULL
	GotValue bool     // a FunctionCallResponse, or a one-column row, came
	ErrCode  string   // the SQLSTATE of an ErrorResponse to the library's message
	Err      error    // that error
	Fatal    bool     // that ErrorResponse was FATAL or PANIC: the session ended there
	Done     bool     // the library's part of the reply was read whole
	// Skipped: the server never ran the library's message: an error to the
	// application's, ahead of it in the Sync group, made it skip to the Sync.
	Skipped bool
}

// Take records msg, one message of the reply to the library's message of kind, and
// reports whether it has a place there. It is the one reader of that reply: the reply
// filter decodes the bytes it takes out of the stream into messages for it, Run reads
// them from pgconn.
func (r *Reply) Take(kind LibraryMessage, msg pgproto3.BackendMessage) bool {
	switch m := msg.(type) {
	case *pgproto3.ErrorResponse:
		r.ErrCode = m.Code
		r.Err = pgconn.ErrorResponseToPgError(m)
		r.Fatal = pg.FatalError(r.Err)
		// The server reads nothing after a FATAL; after an ERROR in a Sync group it skips
		// to the Sync, whose ReadyForQuery answers the application's messages.
		r.Done = r.Fatal || kind == LibraryPortal
		return true
	case *pgproto3.ReadyForQuery:
		r.Done = true
		return true
	}
	switch kind {
	case LibraryQuery:
		switch m := msg.(type) {
		case *pgproto3.RowDescription, *pgproto3.EmptyQueryResponse, *pgproto3.CommandComplete:
			return true
		case *pgproto3.DataRow:
			r.Row = make([][]byte, len(m.Values))
			for i, v := range m.Values {
				if v != nil {
					r.Row[i] = append([]byte{}, v...)
				}
			}
			if len(r.Row) == 1 {
				r.Value, r.GotValue = r.Row[0], true
			}
			return true
		}
	case LibraryPortal:
		switch m := msg.(type) {
		case *pgproto3.ParseComplete, *pgproto3.BindComplete:
			return true
		case *pgproto3.DataRow:
			if len(m.Values) == 1 {
				r.GotValue = true
				r.Value = append([]byte(nil), m.Values[0]...)
				if m.Values[0] == nil {
					r.Value = nil
				}
			}
			return true
		case *pgproto3.CommandComplete:
			r.Done = true
			return true
		}
	case LibraryCall:
		if m, ok := msg.(*pgproto3.FunctionCallResponse); ok {
			r.GotValue = true
			if m.Result != nil {
				r.Value = append([]byte{}, m.Result...)
			}
			return true
		}
	}
	return false
}

// maxLibraryMessage bounds a message read while the library's part is being taken out:
// PostgreSQL's replies to it are a few hundred bytes, and an asynchronous message larger
// than this is not expected there either.
const maxLibraryMessage = 1 << 20

// ErrUnaccountedReply is a message the library cannot account for in its part of the
// reply: the connection is closed rather than pgconn left reading the wrong reply.
var ErrUnaccountedReply = errors.New("otelpgxtx: the server's reply to the library's message is not the one the protocol defines; the connection is closed")

// filterState is where a replyFilter is in the reply it splits.
type filterState uint8

const (
	// filterLibrary: the library's part is still being read out of the stream.
	filterLibrary filterState = iota
	// filterApplication: the library's message went after the application's (After):
	// their replies, up to the last ReadyForQuery they get, go to pgconn first.
	filterApplication
	// filterReplacing: the library's part is read, the call failed with an ERROR (held),
	// and COMMIT's ROLLBACK tag, which held replaces, is still to come.
	filterReplacing
	// filterPassing: the library's part is read and nothing is to be replaced: the rest
	// goes to pgconn unparsed.
	filterPassing
	// filterFailed: something could not be accounted for (err); nothing more reaches
	// pgconn.
	filterFailed
)

// replyFilter splits the server's bytes, from the start of the reply to a write the
// library added to, into the library's part (kept in lib) and everything else (out, for
// pgconn, in the order it came). Asynchronous messages — NoticeResponse, ParameterStatus,
// NotificationResponse — are pgconn's wherever they come. Bytes may arrive split anywhere.
type replyFilter struct {
	kind   LibraryMessage
	after  bool // the library's message followed the application's (Addition.After)
	commit bool // it went ahead of COMMIT (Addition.Commit): its ERROR replaces the ROLLBACK tag
	// syncs is how many of the application's replies, each ended by a ReadyForQuery, are
	// still to pass before the library's (filterApplication); app follows their messages.
	// execs, for LibraryPortal, is how many of the application's Executes are still to be
	// completed before the library's reply comes.
	syncs int
	execs int
	app   streamPos
	state filterState
	lib   Reply
	in    []byte // bytes of a message not yet complete
	out   []byte // bytes for pgconn, not yet read
	err   error  // ErrUnaccountedReply and its cause (filterFailed)
	held  []byte // the call's ERROR, given to pgconn in place of COMMIT's ROLLBACK tag
	// then: the library's Query ahead is read first (kind LibraryQuery); its reply whole,
	// kept in ahead, the filter goes on as the portal's in the group (Addition.Ahead).
	then  bool
	ahead Reply
	// decoded are the messages the library's part is decoded into (decoder).
	decoded decodedMessages
}

// feed takes bytes the server sent; pgconn's part of them goes to out, after what out
// holds. b is not changed.
func (f *replyFilter) feed(b []byte) { f.scan(b, false) }

// feedInPlace takes b, bytes the server sent, read into pgconn's own buffer, and leaves
// pgconn's part of them at its start, in order, where it lies or moved down over the
// library's part: it returns how many bytes of b are pgconn's now. What would not fit there
// (an error given in place of a shorter message), and all of it when out still holds bytes
// for pgconn, goes to out, to be given after those n bytes. Only a message cut by the end
// of b is copied (in), until its end comes. A reply the filter cannot account for leaves
// pgconn nothing (n is 0; see fail).
func (f *replyFilter) feedInPlace(b []byte) (n int) { return f.scan(b, true) }

// filterOut is where scan writes pgconn's part of b: back at b's start (n bytes so far)
// while inPlace, else to the filter's out.
type filterOut struct {
	b       []byte
	n       int
	inPlace bool
}

// emit gives pgconn m, bytes of b or of the filter's own (in, held); read is how many bytes
// of b are consumed, m's included when it lies in b. In place, m goes right after what is
// there already, as long as that does not reach into bytes of b still to be read; once
// something did not fit, the rest of b goes to out, after it in order.
func (f *replyFilter) emit(o *filterOut, m []byte, read int) {
	switch {
	case len(m) == 0:
	case o.inPlace && o.n+len(m) <= read:
		if &o.b[o.n] != &m[0] { // where it lies already: nothing to move
			copy(o.b[o.n:], m)
		}
		o.n += len(m)
	default:
		o.inPlace = false
		f.out = append(f.out, m...)
	}
}

// scan takes b, bytes the server sent: pgconn's part goes back at b's start when inPlace
// and out is empty (see feedInPlace), else to out (b unchanged). Once the library's part
// is read, the rest goes to pgconn unparsed.
func (f *replyFilter) scan(b []byte, inPlace bool) int {
	o := filterOut{b: b, inPlace: inPlace && len(f.out) == 0}
	for r := 0; r < len(b) && f.state != filterFailed; {
		switch f.state {
		case filterPassing:
			f.emit(&o, b[r:], len(b))
			r = len(b)
		case filterApplication:
			r = f.passApplication(&o, b, r)
		default: // filterLibrary, filterReplacing: the library's part, message by message
			r = f.library(&o, b, r)
		}
	}
	if f.state == filterFailed {
		return 0
	}
	return o.n
}

// library reads whole messages of b from r on while the library's part is being read, and
// returns how far it read. A message cut by the end of b is kept in in until its end
// comes.
func (f *replyFilter) library(o *filterOut, b []byte, r int) int {
	for r < len(b) && (f.state == filterLibrary || f.state == filterReplacing) {
		if len(f.in) == 0 && len(b)-r >= 5 {
			_, n, ok := msgHeader(b[r:])
			if !ok || n > maxLibraryMessage {
				f.fail(fmt.Errorf("message %q of length %d", b[r], n))
				return len(b)
			}
			if len(b)-r >= 1+n { // whole in b: read where it lies
				f.message(o, b[r:r+1+n], r+1+n)
				r += 1 + n
				continue
			}
		}
		// A message begun in an earlier read, or cut by the end of b: its header first,
		// then its body, into in.
		if k := min(5-len(f.in), len(b)-r); k > 0 {
			f.in = append(f.in, b[r:r+k]...)
			r += k
		}
		if len(f.in) < 5 {
			return r
		}
		_, n, ok := msgHeader(f.in)
		if !ok || n > maxLibraryMessage {
			f.fail(fmt.Errorf("message %q of length %d", f.in[0], n))
			return len(b)
		}
		k := min(1+n-len(f.in), len(b)-r)
		f.in = append(f.in, b[r:r+k]...)
		r += k
		if len(f.in) < 1+n {
			return r
		}
		f.message(o, f.in, r)
		f.in = f.in[:0]
	}
	return r
}

// passApplication gives pgconn b's bytes from r up to the end of the ReadyForQuery that
// ends the application's replies, and returns where the rest begins: the library's reply,
// and what follows.
func (f *replyFilter) passApplication(o *filterOut, b []byte, r int) int {
	for r < len(b) && f.state == filterApplication {
		n, typ, whole := f.app.step(b[r:])
		f.emit(o, b[r:r+n], r+n)
		r += n
		switch {
		case !whole:
		case f.kind == LibraryPortal:
			switch typ {
			case 'C', 'I', 's': // an Execute's completion: CommandComplete, EmptyQueryResponse, PortalSuspended
				if f.execs--; f.execs == 0 {
					f.state = filterLibrary
				}
			case 'E', 'Z':
				// An error: the server skips to the Sync, the library's messages with the
				// rest; its ReadyForQuery ends the reply. (Or the session's end.)
				f.lib.Done, f.lib.Skipped, f.state = true, true, filterPassing
			}
		case typ == 'Z':
			if f.syncs--; f.syncs == 0 {
				f.state = filterLibrary
			}
		}
	}
	return r
}

// finished reports whether the library's part of the reply is read and nothing of it is
// still to be given to pgconn in place of something else.
func (f *replyFilter) finished() bool { return f.state == filterPassing }

// message judges one whole message, the library's or pgconn's (see emit for o and read).
// m is read here and not kept: what the library keeps of it is copied.
func (f *replyFilter) message(o *filterOut, m []byte, read int) {
	typ, body := m[0], m[5:]
	switch typ {
	case 'N', 'S', 'A': // NoticeResponse, ParameterStatus, NotificationResponse
		f.emit(o, m, read)
		return
	}
	if f.state == filterReplacing {
		// COMMIT's reply after the call failed: ROLLBACK, then ReadyForQuery.
		switch {
		case typ == 'C' && string(bytes.TrimRight(body, "\x00")) == "ROLLBACK":
			f.emit(o, f.held, read)
		case typ == 'Z':
			f.emit(o, m, read)
			f.state = filterPassing
		default:
			f.fail(fmt.Errorf("message %q after the library's call failed", typ))
		}
		return
	}
	msg := f.decoder(typ)
	if msg == nil {
		f.fail(fmt.Errorf("message %q", typ))
		return
	}
	if err := msg.Decode(body); err != nil {
		f.fail(err)
		return
	}
	if !f.lib.Take(f.kind, msg) {
		f.fail(fmt.Errorf("message %q", typ))
		return
	}
	switch {
	case typ == 'E' && (f.lib.Fatal || f.kind == LibraryPortal && f.commit):
		// The server reads nothing after a FATAL: it is the reply to what pgconn sent; and
		// an ERROR to the library's part of an implicit transaction's Sync group is that
		// transaction's failure: the error, then the Sync's ReadyForQuery, are its reply.
		// (An xid read after a statement of a transaction block, Commit false, keeps its
		// ERROR: the statement succeeded, the block is aborted, as the Sync's ReadyForQuery
		// then says.)
		f.emit(o, m, read)
	case typ == 'E' && f.commit && !f.then && f.lib.ErrCode != pg.InFailedTransaction:
		// See Addition.Commit: an error that only says the transaction had already failed
		// is no cause, COMMIT's ROLLBACK is its own answer then.
		f.held = append([]byte{}, m...)
	}
	switch {
	case !f.lib.Done:
	case f.then && !f.lib.Fatal:
		// The Query ahead is answered: the group's replies pass, up to the portal's.
		f.then, f.ahead, f.lib, f.kind, f.state = false, f.lib, Reply{}, LibraryPortal, filterApplication
	case f.then:
		f.then, f.ahead, f.lib, f.state = false, f.lib, Reply{Done: true, Fatal: true, Err: f.lib.Err, ErrCode: f.lib.ErrCode}, filterPassing
	case f.held != nil && !f.lib.Fatal:
		f.state = filterReplacing
	default:
		f.state = filterPassing
	}
}

// decoder returns a message of type typ to decode one of the library's part of a reply
// into, nil for one that has no place there: the filter's own for the messages of every
// reply (Reply.Take copies what it keeps of them), so that reading them allocates nothing —
// a DataRow's values slice is made by pgproto3 only past the filter's room for two columns
// (it makes one of 32 otherwise).
func (f *replyFilter) decoder(typ byte) pgproto3.BackendMessage {
	d := &f.decoded
	switch typ {
	case 'E':
		return &pgproto3.ErrorResponse{}
	case 'Z':
		return &d.ready
	case 'V':
		return &d.call
	case 'D':
		d.row.Values = d.values[:0]
		return &d.row
	case 'T':
		return &pgproto3.RowDescription{}
	case 'I':
		return &pgproto3.EmptyQueryResponse{}
	case 'C':
		return &d.tag
	case '1':
		return &pgproto3.ParseComplete{}
	case '2':
		return &pgproto3.BindComplete{}
	}
	return nil
}

// decodedMessages are a filter's messages to decode into (decoder).
type decodedMessages struct {
	ready  pgproto3.ReadyForQuery
	call   pgproto3.FunctionCallResponse
	row    pgproto3.DataRow
	values [2][]byte
	tag    pgproto3.CommandComplete
}

// fail records a reply that cannot be accounted for; nothing more is given to pgconn.
func (f *replyFilter) fail(cause error) {
	f.state = filterFailed
	f.err = fmt.Errorf("%w (%v)", ErrUnaccountedReply, cause)
	f.in, f.out = nil, nil
}
