package main

import (
	"encoding/binary"
	"testing"
)

// buildMO writes a catalog in the .mo format with the given byte order.
func buildMO(order binary.ByteOrder, pairs [][2]string) []byte {
	n := uint32(len(pairs))
	origs, trans := uint32(28), 28+8*n
	data := trans + 8*n
	b := make([]byte, data)
	order.PutUint32(b, 0x950412de)
	order.PutUint32(b[8:], n)
	order.PutUint32(b[12:], origs)
	order.PutUint32(b[16:], trans)
	for i, p := range pairs {
		for j, table := range []uint32{origs, trans} {
			at := table + 8*uint32(i)
			order.PutUint32(b[at:], uint32(len(p[j])))
			order.PutUint32(b[at+4:], uint32(len(b)))
			b = append(b, p[j]...)
			b = append(b, 0)
		}
	}
	return b
}

func TestParseMO(t *testing.T) {
	pairs := [][2]string{
		{"", "Content-Type: text/plain; charset=UTF-8\n"},
		{committedLocally, "Die Transaktion wurde lokal bereits committet."},
		{"one file\x00%d files", "eine Datei\x00%d Dateien"},
	}
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		cat, err := parseMO(buildMO(order, pairs))
		if err != nil {
			t.Fatalf("%v: %v", order, err)
		}
		if got := cat.msgs[committedLocally]; got != pairs[1][1] {
			t.Errorf("%v: translation = %q", order, got)
		}
		if got := cat.msgs["one file"]; got != "eine Datei" {
			t.Errorf("%v: plural = %q, want the first form", order, got)
		}
		if cs := cat.charset(); cs != "UTF-8" {
			t.Errorf("%v: charset = %q", order, cs)
		}
	}
	bad := buildMO(binary.LittleEndian, pairs)
	for name, b := range map[string][]byte{
		"short":     bad[:10],
		"magic":     append([]byte{1, 2, 3, 4}, bad[4:]...),
		"truncated": bad[:40],
	} {
		if _, err := parseMO(b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}
