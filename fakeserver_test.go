package otelpgxtx

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/txevidence/otelpgxtx/internal/reference"
)

// fakePG is an in-process PostgreSQL stand-in for micro-benchmarks: a net.Conn that
// answers the frontend protocol synchronously inside Write, with backend messages
// encoded by pgx's own pgproto3. No goroutine, no socket, no scheduler hand-off: what a
// benchmark over it measures is pgx and the tracers, not I/O.
//
// It speaks enough of the protocol for pgx's default exec mode (statement cache:
// Parse/Describe/Sync once, then Bind/[Describe]/Execute/Sync) and for the simple
// protocol pgx uses for BEGIN, COMMIT and ROLLBACK. Its transaction status follows
// BEGIN ('T') and COMMIT/ROLLBACK ('I'), so pgconn's TxStatus is what a real server
// would make it. Every SELECT returns one row with one int8 column (42), except Run's
// cluster-identity read, which gets its text columns so that commit references work
// over the fake too; a FunctionCall (the xid read) returns 42; INSERT, UPDATE and DELETE
// affect one row. It allocates nothing per message once warm, so allocation counts over
// it are pgx's and the tracers'.
type fakePG struct {
	mu     sync.Mutex
	cond   sync.Cond
	in     []byte // client bytes not processed yet (an incomplete message)
	out    []byte // server bytes not read yet
	closed bool

	started bool
	status  byte // 'I' idle, 'T' in a transaction
	stmts   map[string]fakeStmt
	portal  fakeStmt // the statement bound to the unnamed portal
	binary  bool     // the portal's result column is in binary format
	bound   bool

	// Reused messages, so that answering allocates nothing.
	rfq      pgproto3.ReadyForQuery
	cc       pgproto3.CommandComplete
	rowDesc  pgproto3.RowDescription
	dataRow  pgproto3.DataRow
	fcr      pgproto3.FunctionCallResponse
	params   pgproto3.ParameterDescription
	oids     [8]uint32
	textVal  [][]byte
	binVal   [][]byte
	textCols []pgproto3.FieldDescription
	binCols  []pgproto3.FieldDescription
	idCols   []pgproto3.FieldDescription
	idVals   [][]byte

	// Scripting, for the tests of servers that are not PostgreSQL; all nil or false in
	// the benchmarks, where they cost nothing.
	//
	// startup replaces the ParameterStatus messages sent at connection start.
	startup [][2]string
	// replies answers a simple Query of exactly this text instead of the defaults.
	replies map[string]fakeReply
	// record keeps, in seen, every simple Query's text and "FunctionCall" for each
	// FunctionCall, in order.
	record bool
	seen   []string
	// closing: a FATAL was sent; Read returns EOF once it has been read.
	closing bool
}

// fakeReply is a scripted answer to one simple Query.
type fakeReply struct {
	notices []*pgproto3.NoticeResponse // sent first, in order
	err     *pgproto3.ErrorResponse    // instead of the command's completion
	tag     string                     // the command tag when err is nil
	status  byte                       // the transaction status afterwards; 0 leaves it
}

// fakeKind is what a statement is, for the fake's answers.
type fakeKind uint8

const (
	fakeEmpty fakeKind = iota
	fakeOther
	fakeBegin
	fakeCommit
	fakeRollback
	fakeSelect
	fakeInsert
	fakeUpdate
	fakeDelete
	fakeIdentity // Run's cluster-identity read: two text columns
)

// fakeTags are the command tags per kind.
var fakeTags = [...][]byte{
	fakeOther:    []byte("SET"),
	fakeBegin:    []byte("BEGIN"),
	fakeCommit:   []byte("COMMIT"),
	fakeRollback: []byte("ROLLBACK"),
	fakeSelect:   []byte("SELECT 1"),
	fakeInsert:   []byte("INSERT 0 1"),
	fakeUpdate:   []byte("UPDATE 1"),
	fakeDelete:   []byte("DELETE 1"),
	fakeIdentity: []byte("SELECT 1"),
}

type fakeStmt struct {
	kind   fakeKind
	params int
}

// fakeOIDInt8 is PostgreSQL's int8 type.
const fakeOIDInt8 = 20

func newFakePG() *fakePG {
	c := &fakePG{status: 'I', stmts: map[string]fakeStmt{}}
	c.cond.L = &c.mu
	c.textVal = [][]byte{[]byte("42")}
	c.binVal = [][]byte{binary.BigEndian.AppendUint64(nil, 42)}
	col := pgproto3.FieldDescription{Name: []byte("v"), DataTypeOID: fakeOIDInt8, DataTypeSize: 8, TypeModifier: -1}
	c.textCols = []pgproto3.FieldDescription{col}
	col.Format = 1
	c.binCols = []pgproto3.FieldDescription{col}
	return c
}

// fakePGConfig returns a pgx connection config whose connections each talk to a new fake.
func fakePGConfig() *pgx.ConnConfig {
	cfg, err := pgx.ParseConfig("postgres://bench@127.0.0.1:5432/bench?sslmode=disable")
	if err != nil {
		panic(err)
	}
	cfg.DialFunc = func(context.Context, string, string) (net.Conn, error) { return newFakePG(), nil }
	return cfg
}

var errFakeProtocol = errors.New("fakePG: unexpected frontend message")

// Read returns what the fake answered; it blocks only if pgx reads ahead of its
// requests (its background reader may).
func (c *fakePG) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.out) == 0 && !c.closed && !c.closing {
		c.cond.Wait()
	}
	if len(c.out) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.out)
	c.out = c.out[:copy(c.out, c.out[n:])]
	return n, nil
}

// Write takes client bytes and answers every complete message in them.
func (c *fakePG) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	c.in = append(c.in, p...)
	consumed, err := c.process(c.in)
	c.in = c.in[:copy(c.in, c.in[consumed:])]
	c.cond.Broadcast()
	if err != nil {
		c.closed = true
		return len(p), err
	}
	return len(p), nil
}

func (c *fakePG) Close() error {
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
	return nil
}

func (c *fakePG) LocalAddr() net.Addr              { return fakeAddr{} }
func (c *fakePG) RemoteAddr() net.Addr             { return fakeAddr{} }
func (c *fakePG) SetDeadline(time.Time) error      { return nil }
func (c *fakePG) SetReadDeadline(time.Time) error  { return nil }
func (c *fakePG) SetWriteDeadline(time.Time) error { return nil }
func (c *fakePG) send(m pgproto3.BackendMessage)   { c.out, _ = m.Encode(c.out) }
func (c *fakePG) sendTag(k fakeKind)               { c.cc.CommandTag = fakeTags[k]; c.send(&c.cc) }
func (c *fakePG) sendReady()                       { c.rfq.TxStatus = c.status; c.send(&c.rfq) }
func (c *fakePG) sendRowDesc(cols []pgproto3.FieldDescription) {
	c.rowDesc.Fields = cols
	c.send(&c.rowDesc)
}

type fakeAddr struct{}

func (fakeAddr) Network() string { return "fake" }
func (fakeAddr) String() string  { return "fake" }

// process answers the complete messages at the start of data and returns how many
// bytes it consumed.
func (c *fakePG) process(data []byte) (int, error) {
	consumed := 0
	for {
		rest := data[consumed:]
		if !c.started {
			// Untyped: int32 length, int32 code.
			if len(rest) < 8 {
				return consumed, nil
			}
			n := int(binary.BigEndian.Uint32(rest))
			if len(rest) < n {
				return consumed, nil
			}
			consumed += n
			switch binary.BigEndian.Uint32(rest[4:]) {
			case 80877103, 80877104: // SSLRequest, GSSENCRequest: no
				c.out = append(c.out, 'N')
				continue
			case 80877102: // CancelRequest
				return consumed, io.EOF
			}
			c.started = true
			c.send(&pgproto3.AuthenticationOk{})
			startup := c.startup
			if startup == nil {
				startup = fakeStartup
			}
			for _, ps := range startup {
				c.send(&pgproto3.ParameterStatus{Name: ps[0], Value: ps[1]})
			}
			c.send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}})
			c.sendReady()
			continue
		}
		if len(rest) < 5 {
			return consumed, nil
		}
		n := 1 + int(binary.BigEndian.Uint32(rest[1:]))
		if n < 5 {
			return consumed, errFakeProtocol
		}
		if len(rest) < n {
			return consumed, nil
		}
		consumed += n
		if err := c.message(rest[0], rest[5:n]); err != nil {
			return consumed, err
		}
	}
}

// fakeStartup is what the fake reports at connection start unless scripted otherwise:
// what PostgreSQL 16 reports.
var fakeStartup = [][2]string{
	{"server_version", "16.0"}, {"server_encoding", "UTF8"}, {"client_encoding", "UTF8"},
	{"DateStyle", "ISO, MDY"}, {"integer_datetimes", "on"}, {"TimeZone", "UTC"},
	{"standard_conforming_strings", "on"},
}

// reply sends a scripted answer, up to its ReadyForQuery; a FATAL ends the session.
func (c *fakePG) reply(r fakeReply) {
	for _, n := range r.notices {
		c.send(n)
	}
	if r.status != 0 {
		c.status = r.status
	}
	if r.err != nil {
		c.send(r.err)
		if r.err.Severity == "FATAL" || r.err.Severity == "PANIC" {
			c.closing = true
			return
		}
	} else {
		c.cc.CommandTag = []byte(r.tag)
		c.send(&c.cc)
	}
	c.sendReady()
}

// message answers one typed frontend message.
func (c *fakePG) message(typ byte, body []byte) error {
	if c.closing {
		return io.EOF // a FATAL was sent: the session reads nothing more
	}
	switch typ {
	case 'Q': // Query
		sql, _ := fakeCString(body)
		if c.record {
			c.seen = append(c.seen, string(sql))
		}
		if r, ok := c.replies[string(sql)]; ok {
			c.reply(r)
			break
		}
		k := fakeClassify(sql)
		if k == fakeEmpty {
			c.send(&pgproto3.EmptyQueryResponse{})
		} else {
			switch k {
			case fakeSelect:
				c.sendRowDesc(c.textCols)
				c.dataRow.Values = c.textVal
				c.send(&c.dataRow)
			case fakeIdentity:
				c.identity(sql)
				c.sendRowDesc(c.idCols)
				c.dataRow.Values = c.idVals
				c.send(&c.dataRow)
			}
			c.execute(k)
		}
		c.sendReady()
	case 'P': // Parse: name, query, parameter types
		name, rest := fakeCString(body)
		sql, _ := fakeCString(rest)
		c.stmts[string(name)] = fakeStmt{kind: fakeClassify(sql), params: fakeParams(sql)}
		c.send(&pgproto3.ParseComplete{})
	case 'B': // Bind: portal, statement, parameter formats, values, result formats
		_, rest := fakeCString(body)
		name, rest := fakeCString(rest)
		st, ok := c.stmts[string(name)] // no allocation: a map index by string(bytes)
		if !ok {
			return errFakeProtocol
		}
		c.portal, c.bound, c.binary = st, true, fakeBinaryResult(rest)
		c.send(&pgproto3.BindComplete{})
	case 'D': // Describe: 'S' statement or 'P' portal
		if len(body) == 0 {
			return errFakeProtocol
		}
		name, _ := fakeCString(body[1:])
		if body[0] == 'S' {
			st, ok := c.stmts[string(name)]
			if !ok {
				return errFakeProtocol
			}
			c.params.ParameterOIDs = c.oids[:0]
			for range st.params {
				c.params.ParameterOIDs = append(c.params.ParameterOIDs, fakeOIDInt8)
			}
			c.send(&c.params)
			c.describe(st.kind, c.textCols)
			break
		}
		cols := c.textCols
		if c.binary {
			cols = c.binCols
		}
		c.describe(c.portal.kind, cols)
	case 'E': // Execute
		if !c.bound {
			return errFakeProtocol
		}
		if c.portal.kind == fakeSelect {
			c.dataRow.Values = c.textVal
			if c.binary {
				c.dataRow.Values = c.binVal
			}
			c.send(&c.dataRow)
		}
		c.execute(c.portal.kind)
	case 'S': // Sync
		c.bound = false
		c.sendReady()
	case 'C': // Close statement or portal
		if len(body) > 1 && body[0] == 'S' {
			name, _ := fakeCString(body[1:])
			delete(c.stmts, string(name))
		}
		c.send(&pgproto3.CloseComplete{})
	case 'F': // FunctionCall: only Run's xid read is ever called, and answered 42
		if c.record {
			c.seen = append(c.seen, "FunctionCall")
		}
		c.fcr.Result = c.textVal[0]
		c.send(&c.fcr)
		c.sendReady()
	case 'H': // Flush: answers are never held back
	case 'X': // Terminate
		return io.EOF
	default:
		return errFakeProtocol
	}
	return nil
}

// identity prepares the answer to Run's cluster-identity read: as many text
// columns as its select list (before the last " from ") has, each ending in ::text:
// identitySQL's columns (the system identifier, the timeline, the backend's PID, the xid
// read's function),
// and a time in microseconds for every other one, all positive integers.
func (c *fakePG) identity(sql []byte) {
	if i := bytes.LastIndex(sql, []byte(" from ")); i >= 0 {
		sql = sql[:i]
	}
	n := max(bytes.Count(sql, []byte("::text")), 1)
	if len(c.idCols) == n {
		return
	}
	c.idCols, c.idVals = c.idCols[:0], c.idVals[:0]
	for i := range n {
		c.idCols = append(c.idCols, pgproto3.FieldDescription{
			Name: fmt.Appendf(nil, "c%d", i), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1})
		v, ok := fakeIdentityValues[i]
		if !ok {
			v = "1700000000000000" // a server start, in microseconds
		}
		c.idVals = append(c.idVals, []byte(v))
	}
}

// fakeIdentityValues are the fake server's identity columns other than the times.
var fakeIdentityValues = map[int]string{
	reference.ColSystem:             "7000000000000000001",
	reference.ColTimeline:           "1",
	reference.ColXIDFunction:        "5060",
	reference.ColBackendPID:         "1", // BackendKeyData's
	reference.ColFlushLSN:           "0/1000000",
	reference.ColCheckpointLSN:      "0/100",
	reference.ColCheckpointNextXID:  "0:700",
	reference.ColCheckpointTimeline: "1",
	reference.ColCheckpointShutdown: "false",
}

func (c *fakePG) describe(k fakeKind, cols []pgproto3.FieldDescription) {
	if k == fakeSelect {
		c.sendRowDesc(cols)
		return
	}
	c.send(&pgproto3.NoData{})
}

// execute completes a statement of kind k and moves the transaction status.
func (c *fakePG) execute(k fakeKind) {
	switch k {
	case fakeBegin:
		c.status = 'T'
	case fakeCommit, fakeRollback:
		c.status = 'I'
	}
	c.sendTag(k)
}

// fakeCString splits a NUL-terminated string off b, as bytes.
func fakeCString(b []byte) ([]byte, []byte) {
	for i, ch := range b {
		if ch == 0 {
			return b[:i], b[i+1:]
		}
	}
	return b, nil
}

// fakeBinaryResult reads the result format codes at the end of a Bind body that
// starts at the parameter format codes.
func fakeBinaryResult(b []byte) bool {
	if len(b) < 2 {
		return false
	}
	nf := int(binary.BigEndian.Uint16(b))
	b = b[2+2*nf:]
	np := int(binary.BigEndian.Uint16(b))
	b = b[2:]
	for range np {
		l := int32(binary.BigEndian.Uint32(b))
		b = b[4:]
		if l > 0 {
			b = b[l:]
		}
	}
	nr := int(binary.BigEndian.Uint16(b))
	return nr > 0 && binary.BigEndian.Uint16(b[2:]) == 1
}

// fakeClassify reads the statement's first keyword.
func fakeClassify(sql []byte) fakeKind {
	s := bytes.TrimLeft(sql, " \t\r\n")
	for bytes.HasPrefix(s, []byte("--")) {
		i := bytes.IndexByte(s, '\n')
		if i < 0 {
			return fakeEmpty
		}
		s = bytes.TrimLeft(s[i+1:], " \t\r\n")
	}
	if len(s) == 0 {
		return fakeEmpty
	}
	if bytes.Contains(s, []byte("pg_control_system()")) {
		return fakeIdentity
	}
	for _, kw := range fakeKeywords {
		if len(s) >= len(kw.word) && bytes.EqualFold(s[:len(kw.word)], kw.word) {
			return kw.kind
		}
	}
	return fakeOther
}

var fakeKeywords = [...]struct {
	word []byte
	kind fakeKind
}{
	{[]byte("begin"), fakeBegin}, {[]byte("start"), fakeBegin}, {[]byte("commit"), fakeCommit},
	{[]byte("end"), fakeCommit}, {[]byte("rollback"), fakeRollback}, {[]byte("abort"), fakeRollback},
	{[]byte("select"), fakeSelect}, {[]byte("insert"), fakeInsert}, {[]byte("update"), fakeUpdate},
	{[]byte("delete"), fakeDelete},
}

// fakeParams returns the highest $n in sql.
func fakeParams(sql []byte) int {
	highest := 0
	for i := 0; i < len(sql); i++ {
		if sql[i] != '$' {
			continue
		}
		n := 0
		for i+1 < len(sql) && sql[i+1] >= '0' && sql[i+1] <= '9' {
			i++
			n = n*10 + int(sql[i]-'0')
		}
		highest = max(highest, n)
	}
	return highest
}
