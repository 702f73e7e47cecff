package sqltext

import (
	"strings"
	"testing"
)

// tokens returns s as kind:text pairs.
func tokens(s string) []string {
	var out []string
	for i := 0; i < len(s); {
		k, end := Next(s, i)
		out = append(out, kindNames[k]+":"+s[i:end])
		i = end
	}
	return out
}

var kindNames = map[Kind]string{Other: "other", Space: "space", Comment: "comment", Word: "word", QuotedIdent: "ident",
	Param: "param", Literal: "literal", Unterminated: "unterminated"}

// TestNext: each kind of token PostgreSQL's lexer knows, as it reads them.
func TestNext(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
	}{
		{"select 1", "word:select|space: |literal:1"},
		{"'it''s'", "literal:'it''s'"},
		{`E'a\'b'`, `literal:E'a\'b'`},
		{`somee'a\'`, `word:somee|literal:'a\'`}, // only a lone E makes an escape string
		{"$1+$$x;y$$", "param:$1|other:+|literal:$$x;y$$"},
		{"$tag$ ' $tag$", "literal:$tag$ ' $tag$"},
		{`U&"d!0061t"`, `ident:U&"d!0061t"`},
		{"B'101' X'1f' N'x'", "literal:B'101'|space: |literal:X'1f'|space: |literal:N'x'"},
		{"1.5e-3 0x1F 1_000", "literal:1.5e-3|space: |literal:0x1F|space: |literal:1_000"},
		{"-- c\nx", "comment:-- c|space:\n|word:x"},
		{"/* a /* b */ c */x", "comment:/* a /* b */ c */|word:x"},
		{"'open", "unterminated:'open"},
		{"$$open", "unterminated:$$open"},
		{"a;b", "word:a|other:;|word:b"},
	} {
		if got := strings.Join(tokens(tc.in), "|"); got != tc.want {
			t.Errorf("tokens(%q) = %s\nwant %s", tc.in, got, tc.want)
		}
	}
}

// TestStatementEnd: the semicolon that ends a statement, never one inside text.
func TestStatementEnd(t *testing.T) {
	for in, want := range map[string]int{
		"select 1; commit":       8,
		"select ';'; commit":     10,
		"select $$;$$; commit":   12,
		`select "a;b"; x`:        12,
		"select 1 -- ;\n; x":     14,
		"select /* ; */ 1; x":    16,
		`select somee'\'; x'; y`: 15, // a standard string: its backslash is text
		`select E'\'; x'; y`:     15,
		"select 'open; x":        15,
		"no semicolon":           12,
	} {
		if got := StatementEnd(in); got != want {
			t.Errorf("StatementEnd(%q) = %d, want %d", in, got, want)
		}
	}
}

// TestSkipSpace and TestNextWord: leading white space and comments, then a keyword.
func TestSkipSpace(t *testing.T) {
	if got := SkipSpace(" \t-- x\n /* y /* z */ */ begin"); got != "begin" {
		t.Errorf("SkipSpace = %q", got)
	}
	if w, rest := NextWord("  /* c */ Begin_Work; x"); w != "Begin_Work" || rest != "; x" {
		t.Errorf("NextWord = %q, %q", w, rest)
	}
	if got := SkipSpace("-- only a comment"); got != "" {
		t.Errorf("SkipSpace of a comment = %q", got)
	}
}

// FuzzNext: any text is read to its end in tokens that each advance, never panicking;
// StatementEnd is a semicolon or the end; SkipSpace returns a suffix; nothing allocates.
func FuzzNext(f *testing.F) {
	for _, s := range []string{"select 'a''b'; commit", "$a$ x $a$;", `E'\\';`, "/* /* */", "U&'x' -- y", "1e+5;2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for i := 0; i < len(s); {
			_, end := Next(s, i)
			if end <= i || end > len(s) {
				t.Fatalf("Next(%q, %d) = %d: no progress or past the end", s, i, end)
			}
			i = end
		}
		if e := StatementEnd(s); e != len(s) && (e > len(s) || s[e] != ';') {
			t.Fatalf("StatementEnd(%q) = %d", s, e)
		}
		if rest := SkipSpace(s); !strings.HasSuffix(s, rest) {
			t.Fatalf("SkipSpace(%q) = %q, not a suffix", s, rest)
		}
		if n := testing.AllocsPerRun(1, func() { StatementEnd(s); SkipSpace(s) }); n != 0 {
			t.Fatalf("%v allocations", n)
		}
	})
}
