package wire

// Benchmarks of what the wrapper costs one autocommit statement, as the tracer drives it:
// the calls the root package makes around pgconn's write and read (MarkCommit, WatchEnds,
// Write, Read, Collect, CommitNotSent, RepliedClean), over an in-memory connection whose
// every read returns the server's whole reply, as on loopback — and the FATAL peek on a
// real loopback socket. `go test -run '^$' -bench . -count 10 ./internal/wire/` and
// benchstat compare a change's before and after.

import (
	"bytes"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// replayConn is a net.Conn whose every read returns reply whole and whose writes take
// everything: the server answering each statement at once, in one read of pgconn's.
type replayConn struct {
	net.Conn // nil: only what the wrapper calls is implemented
	reply    []byte
}

func (c *replayConn) Read(p []byte) (int, error)      { return copy(p, c.reply), nil }
func (c *replayConn) Write(b []byte) (int, error)     { return len(b), nil }
func (c *replayConn) SetReadDeadline(time.Time) error { return nil }

// benchFrontend encodes the frontend messages ms as one write.
func benchFrontend(b *testing.B, ms ...pgproto3.FrontendMessage) []byte {
	b.Helper()
	var out []byte
	for _, m := range ms {
		var err error
		if out, err = m.Encode(out); err != nil {
			b.Fatal(err)
		}
	}
	return out
}

// benchStatement is one autocommit statement of pgx's default mode (a cached prepared
// statement: Bind, Execute, Sync) and the server's whole reply to it; xid: the write
// carries the xid read inside its Sync group, as WithCommitReference arms it.
type benchStatement struct {
	name  string
	write bool // an implicit transaction: a frame, its COMMIT marked
	xid   bool
	reply []byte
}

func benchStatements(b testing.TB) []benchStatement {
	bound, parsed := msg(b, &pgproto3.BindComplete{}), msg(b, &pgproto3.ParseComplete{})
	idle := msg(b, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	cc := func(tag string) []byte { return msg(b, &pgproto3.CommandComplete{CommandTag: []byte(tag)}) }
	row := func(v string) []byte { return msg(b, &pgproto3.DataRow{Values: [][]byte{[]byte(v)}}) }
	return []benchStatement{
		{"write", true, false, bytes.Join([][]byte{bound, cc("INSERT 0 1"), idle}, nil)},
		{"write_xid", true, true, bytes.Join([][]byte{bound, cc("INSERT 0 1"), parsed, bound, row("74125"), cc("SELECT 1"), idle}, nil)},
		{"read", false, false, bytes.Join([][]byte{bound, row("\x00\x00\x00\x00\x00\x00\x00\x07"), cc("SELECT 1"), idle}, nil)},
	}
}

// BenchmarkWireStatement is the wrapper's share of one autocommit statement sent on an
// instrumented connection (the tracer's calls around pgconn's write and its one read of
// the reply), per statement: a write (an implicit transaction: its position marked, its
// reply watched), the same with the xid read spliced into its Sync group, and a read (no
// frame). The in-memory connection has no socket, so no peek: BenchmarkWirePeek is its
// price.
func BenchmarkWireStatement(b *testing.B) {
	write := benchFrontend(b, &pgproto3.Bind{ParameterFormatCodes: []int16{1}, Parameters: [][]byte{make([]byte, 8)}, ResultFormatCodes: []int16{1}},
		&pgproto3.Execute{}, &pgproto3.Sync{})
	xidMsg := benchFrontend(b, &pgproto3.Parse{Query: "select pg_catalog.pg_current_xact_id_if_assigned()::text"}, &pgproto3.Bind{},
		&pgproto3.Execute{}, &pgproto3.Flush{})
	for _, s := range benchStatements(b) {
		b.Run(s.name, func(b *testing.B) {
			c := NewConn(&replayConn{reply: s.reply}, nil, true)
			buf := make([]byte, 8192) // pgconn's read buffer
			b.ReportAllocs()
			cpu := processCPU(b)
			for b.Loop() {
				if s.write {
					c.MarkCommit(true)
					c.WatchEnds()
				}
				if s.xid && !c.Arm(&Addition{Kind: LibraryPortal, Extended: true, Commit: true, Msg: xidMsg}) {
					b.Fatal("refused")
				}
				if _, err := c.Write(write); err != nil {
					b.Fatal(err)
				}
				if n, err := c.Read(buf); n == 0 || err != nil || buf[n-6] != 'Z' {
					b.Fatalf("read %d, %v: %q", n, err, buf[:n])
				}
				if s.xid {
					if a, _ := c.Collect(false); a == nil || string(a.Reply().Value) != "74125" {
						b.Fatalf("collected %+v", a)
					}
				}
				if s.write && (c.CommitNotSent() || !c.RepliedClean()) {
					b.Fatal("not sent, or not clean")
				}
				c.WatchEnds()
			}
			b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkReplyFilterCall is the tracer's reading of the call's reply ahead of COMMIT's:
// what a commit with a reference adds to reading its reply, per commit. The filter is
// reset in place, as the connection's is for each addition.
func BenchmarkReplyFilterCall(b *testing.B) {
	reply := bytes.Join([][]byte{
		msg(b, &pgproto3.FunctionCallResponse{Result: []byte("m731")}), msg(b, &pgproto3.ReadyForQuery{TxStatus: 'T'}),
		msg(b, &pgproto3.CommandComplete{CommandTag: []byte("COMMIT")}), msg(b, &pgproto3.ReadyForQuery{TxStatus: 'I'}),
	}, nil)
	f := new(replyFilter)
	b.ReportAllocs()
	cpu := processCPU(b)
	for b.Loop() {
		*f = replyFilter{kind: LibraryCall, commit: true}
		f.feed(reply)
		if !f.finished() || len(f.out) == 0 {
			b.Fatal("not read")
		}
	}
	b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
}

// processCPU is the CPU time (user and system) this process has used so far: unlike
// ns/op, it does not grow while a loaded machine runs other work.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
