package pgtest

import (
	"bytes"
	"encoding/binary"

	"github.com/jackc/pgx/v5/pgproto3"
)

// ReportVersion has the server_version the server reports at connection start (its
// ParameterStatus) reach the client as v, for connections accepted from then on: the
// client sees a server of that version, whatever runs behind ("" stops it).
func (p *Proxy) ReportVersion(v string) {
	p.mu.Lock()
	p.version = v
	p.mu.Unlock()
}

// versionRewrite replaces the server_version ParameterStatus in the server's messages up
// to its first ReadyForQuery, the end of connection start; after it, bytes pass as they
// are.
type versionRewrite struct {
	version string
	pending []byte // an incomplete message
	done    bool
}

// rewrite returns what of b goes on to the client now.
func (r *versionRewrite) rewrite(b []byte) []byte {
	if r.version == "" || r.done {
		return b
	}
	r.pending = append(r.pending, b...)
	var out []byte
	for len(r.pending) >= 5 {
		end := 1 + int(binary.BigEndian.Uint32(r.pending[1:5]))
		if end < 5 || len(r.pending) < end {
			break
		}
		msg := r.pending[:end]
		if msg[0] == 'S' && bytes.HasPrefix(msg[5:], []byte("server_version\x00")) {
			msg, _ = (&pgproto3.ParameterStatus{Name: "server_version", Value: r.version}).Encode(nil)
		}
		out = append(out, msg...)
		r.pending = r.pending[end:]
		if msg[0] == 'Z' {
			r.done = true
			out = append(out, r.pending...)
			r.pending = nil
			break
		}
	}
	return out
}
