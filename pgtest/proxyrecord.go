package pgtest

import "sync"

// Record makes the proxy record every connection it accepts from now on, byte for byte
// in each direction, as received, from the startup message (or CancelRequest) on: to
// compare what clients send, not to inject faults. An SSLRequest or GSSENCRequest and
// its answer are not recorded, and over TLS the bytes are the plain text inside, so a
// conversation reads the same over either transport.
func (p *Proxy) Record() *Recording {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rec == nil {
		p.rec = &Recording{}
	}
	return p.rec
}

// Recording is the conversations of the connections a proxy accepted while recording.
type Recording struct {
	mu    sync.Mutex
	convs []*Conversation
}

// add starts the conversation of a newly accepted connection.
func (r *Recording) add() *Conversation {
	c := &Conversation{done: make(chan struct{})}
	r.mu.Lock()
	r.convs = append(r.convs, c)
	r.mu.Unlock()
	return c
}

// Conversations returns the recorded connections in the order they were accepted.
func (r *Recording) Conversations() []*Conversation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*Conversation(nil), r.convs...)
}

// Conversation is one proxied connection's bytes.
type Conversation struct {
	client, server recorded
	done           chan struct{}
}

// Done is closed when both sides of the connection are closed: the recording is complete.
func (c *Conversation) Done() <-chan struct{} { return c.done }

// ClientBytes returns a copy of what the client sent.
func (c *Conversation) ClientBytes() []byte { return c.client.bytes() }

// ServerBytes returns a copy of what the server sent.
func (c *Conversation) ServerBytes() []byte { return c.server.bytes() }

// recorded is one direction's bytes; its relay goroutine appends while tests read.
type recorded struct {
	mu  sync.Mutex
	buf []byte
}

// append records bytes the relay received.
func (r *recorded) append(b []byte) {
	r.mu.Lock()
	r.buf = append(r.buf, b...)
	r.mu.Unlock()
}

// bytes returns a copy, so that a test reads it while the relay appends.
func (r *recorded) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]byte(nil), r.buf...)
}
