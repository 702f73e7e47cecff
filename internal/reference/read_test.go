package reference

import (
	"context"
	"testing"
)

// TestReadsEarly: the xid read never follows a string with a COPY in it, wherever the
// COPY is, and is not fooled by one in a literal or a comment.
func TestReadsEarly(t *testing.T) {
	c := &Conn{}
	for sql, want := range map[string]bool{
		"insert into t values (1)":                                  true,
		"begin; insert into t values (1)":                           true,
		"copy t from stdin":                                         false,
		"/* x */ COPY t from stdin":                                 false,
		"begin; copy t from stdin":                                  false,
		"insert into t values (1); copy t to stdout":                false,
		"insert into t values (';copy t from stdin')":               true,
		"insert into t values (1); -- copy t from stdin":            true,
		"insert into t values (1); select 1; copy t (a) from stdin": false,
	} {
		if got := c.readsEarly(context.Background(), sql); got != want {
			t.Errorf("readsEarly(%q) = %v, want %v", sql, got, want)
		}
	}
}
