package reference

import (
	"strings"
	"testing"

	"github.com/txevidence/otelpgxtx/internal/wire"
	"github.com/txevidence/otelpgxtx/outcome"
)

// TestCallRef: what each reply to the call ahead of COMMIT makes of the reference.
func TestCallRef(t *testing.T) {
	c := &Conn{identity: identity{systemID: 7, timeline: 1, serverStart: 1, database: "d", checkedAt: 5}}
	m := c.newMarkerFn(`"s"."t"`, []byte("16400"))
	id := outcome.NewOperationID()
	val := func(v string) wire.Reply { return wire.Reply{GotValue: true, Value: []byte(v), Done: true} }
	for _, tc := range []struct {
		name   string
		m      *markerFn
		r      wire.Reply
		want   string // the reference, "" for none
		marker bool
	}{
		{"marker inserted", m, val("m731"), "pg:7/1/731/1;checked=5;marker=", true},
		{"marker, no reply", m, wire.Reply{}, "pg:7/1/0/1;checked=5;marker=", true},
		{"read-only", m, val("r731"), "pg:7/1/731/1", false},
		{"no xid", m, val("n"), "pg:7/1/0/1", false},
		{"not the function's answer", m, val("m"), "", false},
		{"garbage", m, val("x12"), "", false},
		{"the call failed", m, wire.Reply{ErrCode: "57014", Done: true}, "", false},
		{"xid read", nil, val("731"), "pg:7/1/731/1", false},
		{"xid read, NULL", nil, wire.Reply{GotValue: true, Done: true}, "pg:7/1/0/1", false},
		{"xid read, no reply", nil, wire.Reply{}, "", false},
	} {
		ref := c.callRef(tc.m, id, tc.r)
		got := ""
		if ref != nil {
			got = ref.String()
		}
		if tc.want == "" && got != "" || tc.want != "" && (!strings.HasPrefix(got, tc.want) || ref.HasMarker() != tc.marker) {
			t.Errorf("%s: reference %q, want %q (marker %v)", tc.name, got, tc.want, tc.marker)
		}
	}
}

// TestNilConnKnowsNoIdentity: a connection without the references' state has no identity.
func TestNilConnKnowsNoIdentity(t *testing.T) {
	var c *Conn
	if c.Known() {
		t.Fatal("a nil Conn knows an identity")
	}
}

// TestParseVXID: the lxid read's row, as pg_locks shows a virtual transaction id
// (backendId/lxid before PostgreSQL 17, procNumber/lxid since), with the pid; anything
// else is no answer.
func TestParseVXID(t *testing.T) {
	for _, tc := range []struct {
		row  [][]byte
		want vxid
	}{
		{[][]byte{[]byte("3/1234"), []byte("4242")}, vxid{proc: 3, lxid: 1234, pid: 4242, ok: true}},
		{[][]byte{[]byte("3/4294967295"), []byte("1")}, vxid{proc: 3, lxid: 4294967295, pid: 1, ok: true}},
		{[][]byte{[]byte("31234"), []byte("4242")}, vxid{}},
		{[][]byte{[]byte("3/x"), []byte("4242")}, vxid{}},
		{[][]byte{[]byte("3/1"), nil}, vxid{}},
		{[][]byte{[]byte("3/1")}, vxid{}},
		{nil, vxid{}},
	} {
		if got := parseVXID(tc.row); got.ok != tc.want.ok || got.ok && got != tc.want {
			t.Errorf("parseVXID(%q) = %+v, want %+v", tc.row, got, tc.want)
		}
	}
}
