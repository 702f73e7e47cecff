package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// catalog is a GNU gettext message catalog: msgid to the first msgstr.
type catalog struct {
	msgs map[string]string
}

// parseMO reads the binary .mo format: a magic number giving the byte order, a revision,
// the number of strings, and the offsets of two tables of (length, offset) pairs, one for
// the original strings and one for the translations, in the same order. A msgid with a
// context is "context\x04msgid"; plural forms are separated by NUL.
func parseMO(b []byte) (catalog, error) {
	if len(b) < 20 {
		return catalog{}, errors.New("not a .mo file: too short")
	}
	var order binary.ByteOrder
	switch binary.LittleEndian.Uint32(b) {
	case 0x950412de:
		order = binary.LittleEndian
	case 0xde120495:
		order = binary.BigEndian
	default:
		return catalog{}, errors.New("not a .mo file: bad magic number")
	}
	if rev := order.Uint32(b[4:]); rev>>16 > 1 {
		return catalog{}, fmt.Errorf("unsupported .mo revision %#x", rev)
	}
	n, origs, trans := order.Uint32(b[8:]), order.Uint32(b[12:]), order.Uint32(b[16:])
	str := func(table, i uint32) (string, error) {
		at := uint64(table) + 8*uint64(i)
		if at+8 > uint64(len(b)) {
			return "", errors.New("string table out of bounds")
		}
		length, off := uint64(order.Uint32(b[at:])), uint64(order.Uint32(b[at+4:]))
		if off+length > uint64(len(b)) {
			return "", errors.New("string out of bounds")
		}
		return string(b[off : off+length]), nil
	}
	cat := catalog{msgs: make(map[string]string, n)}
	for i := range n {
		id, err := str(origs, i)
		if err != nil {
			return catalog{}, err
		}
		tr, err := str(trans, i)
		if err != nil {
			return catalog{}, err
		}
		id, _, _ = strings.Cut(id, "\x00")
		tr, _, _ = strings.Cut(tr, "\x00")
		cat.msgs[id] = tr
	}
	return cat, nil
}

// charset returns the charset of the catalog's header (the translation of "").
func (c catalog) charset() string {
	for _, line := range strings.Split(c.msgs[""], "\n") {
		if v, ok := strings.CutPrefix(line, "Content-Type:"); ok {
			if _, cs, ok := strings.Cut(v, "charset="); ok {
				return strings.TrimSpace(cs)
			}
		}
	}
	return ""
}
