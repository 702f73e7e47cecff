package wire

import "time"

// reader keeps the package's one-reader invariant: at most one read is at the wrapped
// connection at any moment, whoever started it — pgconn (Read, on its own goroutine or its
// background reader's) or the library (Await, and the reads ahead of MarkCommit) — and the
// other waits until that read's bytes are accounted for (fed to the reply filter or held
// for pgconn) before it reads or decides anything. Two reads side by side could feed the
// filter two chunks in the other order, or end one another at the other's deadline.
//
// It also keeps pgconn's read deadline, as pgconn last set it, so that a deadline the
// library sets for its own read is never later than pgconn's and never outlives that read:
// pgconn's is put back as the library's read ends, and a deadline pgconn sets meanwhile
// (its context watcher, from another goroutine) reaches the read at once. A read of
// pgconn's therefore never meets a deadline of the library's.
//
// Conn.mu guards it; it is only used on a connection the library may read (see
// Conn.passThrough).
type reader struct {
	// reading: a read is at the wrapped connection.
	reading bool
	// wake, when set, is closed when that read ends; whoever waits for it set it (one
	// channel for all who wait, made only when someone does).
	wake chan struct{}
	// deadline is pgconn's read deadline; own, while the library reads, the library's.
	deadline, own time.Time
}

// take puts a read at the connection; nobody's is.
func (r *reader) take() { r.reading = true }

// release ends the read at the connection and wakes whoever waits for it.
func (r *reader) release() {
	r.reading = false
	if r.wake != nil {
		close(r.wake)
		r.wake = nil
	}
}

// effective is the read deadline the wrapped connection must have: pgconn's, or the
// library's while it reads, whichever comes first.
func (r *reader) effective() time.Time {
	if r.own.IsZero() || !r.deadline.IsZero() && r.deadline.Before(r.own) {
		return r.deadline
	}
	return r.own
}

// waitRead waits, c.mu held and released meanwhile, until the read at the connection
// ends, or until stop fires (nil: never); it reports whether the read ended.
func (c *Conn) waitRead(stop <-chan time.Time) bool {
	if c.rd.wake == nil {
		c.rd.wake = make(chan struct{})
	}
	wake := c.rd.wake
	c.mu.Unlock()
	defer c.mu.Lock()
	select {
	case <-wake:
		return true
	case <-stop:
		return false
	}
}

// libRead is a read of the library's, c.mu held and released across the read itself: it
// takes the connection's one read (nobody else's is at it), sets the connection's read
// deadline to deadline or pgconn's, whichever is sooner, reads into buf, has then
// account for what came while it still holds the read, and puts pgconn's deadline back.
// ok is false when no read was made (the deadline could not be set).
func (c *Conn) libRead(buf []byte, deadline time.Time, then func(n int, err error)) (ok bool) {
	c.rd.take()
	defer c.rd.release()
	c.rd.own = deadline
	defer c.restoreDeadline()
	if c.Conn.SetReadDeadline(c.rd.effective()) != nil {
		return false
	}
	c.mu.Unlock()
	n, err := c.Conn.Read(buf)
	c.mu.Lock()
	then(n, err)
	return true
}

// restoreDeadline ends the library's deadline: the connection's is pgconn's again. c.mu
// is held.
func (c *Conn) restoreDeadline() {
	c.rd.own = time.Time{}
	_ = c.Conn.SetReadDeadline(c.rd.deadline)
}

// SetReadDeadline sets pgconn's read deadline: the connection's, unless a read of the
// library's, with a sooner deadline of its own, is at it (until that read ends).
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.passThrough {
		return c.Conn.SetReadDeadline(t)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rd.deadline = t
	return c.Conn.SetReadDeadline(c.rd.effective())
}

// SetDeadline sets pgconn's read and write deadlines (see SetReadDeadline).
func (c *Conn) SetDeadline(t time.Time) error {
	if c.passThrough {
		return c.Conn.SetDeadline(t)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rd.deadline = t
	if c.rd.own.IsZero() {
		return c.Conn.SetDeadline(t)
	}
	if err := c.Conn.SetWriteDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetReadDeadline(c.rd.effective())
}
