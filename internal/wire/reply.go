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
}

// feed takes bytes the server sent. Once the library's part is read, the rest goes to out
// unparsed.
func (f *replyFilter) feed(b []byte) {
	for {
		switch f.state {
		case filterFailed:
			return
		case filterPassing:
			f.out = append(f.out, b...)
			return
		case filterApplication:
			if b = f.passApplication(b); len(b) == 0 {
				return
			}
		}
		f.in = append(f.in, b...)
		for f.state == filterLibrary || f.state == filterReplacing {
			if len(f.in) < 5 {
				return
			}
			_, n, ok := msgHeader(f.in)
			if !ok || n > maxLibraryMessage {
				f.fail(fmt.Errorf("message %q of length %d", f.in[0], n))
				return
			}
			if len(f.in) < 1+n {
				return
			}
			f.message(f.in[:1+n])
			if f.state == filterFailed {
				return
			}
			f.in = f.in[1+n:]
		}
		if f.state != filterApplication {
			f.out = append(f.out, f.in...) // filterPassing: what came after the library's part
			f.in = nil
			return
		}
		b, f.in = f.in, nil // the Query ahead was read: the group's replies follow
	}
}

// passApplication gives pgconn b's bytes up to the end of the ReadyForQuery that ends
// the application's replies, and returns the rest: the library's reply, and what follows.
func (f *replyFilter) passApplication(b []byte) []byte {
	for len(b) > 0 && f.state == filterApplication {
		n, typ, whole := f.app.step(b)
		f.out = append(f.out, b[:n]...)
		b = b[n:]
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
	return b
}

// finished reports whether the library's part of the reply is read and nothing of it is
// still to be given to pgconn in place of something else.
func (f *replyFilter) finished() bool { return f.state == filterPassing }

// message judges one whole message: the library's, or pgconn's.
func (f *replyFilter) message(m []byte) {
	typ, body := m[0], m[5:]
	switch typ {
	case 'N', 'S', 'A': // NoticeResponse, ParameterStatus, NotificationResponse
		f.out = append(f.out, m...)
		return
	}
	if f.state == filterReplacing {
		// COMMIT's reply after the call failed: ROLLBACK, then ReadyForQuery.
		switch {
		case typ == 'C' && string(bytes.TrimRight(body, "\x00")) == "ROLLBACK":
			f.out = append(f.out, f.held...)
		case typ == 'Z':
			f.out = append(f.out, m...)
			f.state = filterPassing
		default:
			f.fail(fmt.Errorf("message %q after the library's call failed", typ))
		}
		return
	}
	msg := backendMessage(typ)
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
		f.out = append(f.out, m...)
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

// backendMessage returns an empty message of type typ for the library's part of a reply,
// nil for one that has no place there.
func backendMessage(typ byte) pgproto3.BackendMessage {
	switch typ {
	case 'E':
		return &pgproto3.ErrorResponse{}
	case 'Z':
		return &pgproto3.ReadyForQuery{}
	case 'V':
		return &pgproto3.FunctionCallResponse{}
	case 'D':
		return &pgproto3.DataRow{}
	case 'T':
		return &pgproto3.RowDescription{}
	case 'I':
		return &pgproto3.EmptyQueryResponse{}
	case 'C':
		return &pgproto3.CommandComplete{}
	case '1':
		return &pgproto3.ParseComplete{}
	case '2':
		return &pgproto3.BindComplete{}
	}
	return nil
}

// fail records a reply that cannot be accounted for; nothing more is given to pgconn.
func (f *replyFilter) fail(cause error) {
	f.state = filterFailed
	f.err = fmt.Errorf("%w (%v)", ErrUnaccountedReply, cause)
	f.in, f.out = nil, nil
}
