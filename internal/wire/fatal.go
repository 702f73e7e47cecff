package wire

import "github.com/txevidence/otelpgxtx/internal/pg"

// fatalBeforeCommit reports whether buf, bytes the server sent while the session was
// idle in a transaction, holds an ErrorResponse of severity FATAL or PANIC. The
// protocol says the server closes the connection after one ("FATAL ... the server will
// close the connection", ErrorResponse in the protocol's message flow), and PostgreSQL
// exits the backend (elog.c errfinish: proc_exit for FATAL, abort for PANIC), which
// rolls back its transaction: a COMMIT written after it is never read. A message cut
// off by the end of buf is not judged.
func fatalBeforeCommit(buf []byte) bool {
	for len(buf) >= 5 {
		typ, n, ok := msgHeader(buf)
		if !ok || len(buf) < 1+n {
			return false
		}
		body := buf[5 : 1+n]
		if typ == 'E' && fatalSeverity(body) {
			return true
		}
		buf = buf[1+n:]
	}
	return false
}

// fatalSeverity reads an ErrorResponse body's severity fields, 'S' and 'V', without
// decoding the message (this runs on bytes peeked at, without allocating), and judges
// them with pg.Fatal, the module's one reading of a severity.
func fatalSeverity(body []byte) bool {
	var s, v string
	for len(body) > 0 && body[0] != 0 {
		code := body[0]
		end := 1
		for end < len(body) && body[end] != 0 {
			end++
		}
		if end == len(body) {
			return false
		}
		switch code {
		case 'S':
			s = string(body[1:end])
		case 'V':
			v = string(body[1:end])
		}
		body = body[end+1:]
	}
	return pg.Fatal(s, v)
}
