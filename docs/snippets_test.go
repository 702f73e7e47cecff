package docs

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// snippet is a fenced go block of a page: where it starts (the line after the fence), its
// code, and the words after "go" on the fence line.
type snippet struct {
	page string
	line int
	code string
	info []string
}

// goBlock matches a fenced go block: the fence's words after "go", and the code.
var goBlock = regexp.MustCompile("(?ms)^```go([^\n]*)\n(.*?)^```")

// snippets returns the go blocks of README.md and of the pages of docs/.
func snippets(t *testing.T) []snippet {
	t.Helper()
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []snippet
	for _, page := range append([]string{"../README.md"}, pages...) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range goBlock.FindAllSubmatchIndex(b, -1) {
			out = append(out, snippet{page: page, line: 2 + strings.Count(string(b[:m[0]]), "\n"),
				code: string(b[m[4]:m[5]]), info: strings.Fields(string(b[m[2]:m[3]]))})
		}
	}
	return out
}

// fragmentPrelude is the package around the fragments: what a fragment may use without
// declaring it, as an application has it at hand where the fragment would go.
const fragmentPrelude = `package snippets

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txevidence/otelpgxtx"
	"github.com/txevidence/otelpgxtx/outcome"
	"github.com/txevidence/otelpgxtx/reconcile"
)

var (
	ctx      context.Context
	dsn      string
	out      io.Writer
	cfg      *pgxpool.Config
	pool     *pgxpool.Pool
	recPool  *pgxpool.Pool
	rec      *reconcile.Reconciler
	pending  []outcome.Indeterminate[struct{}]
	transfer func(context.Context) error
	resume   func(outcome.OperationID)

	publishOrderCreated func(context.Context, int64) error
)

// The imports a fragment may leave unused.
var (
	_, _, _, _, _, _, _ = context.Background, errors.Is, fmt.Println, log.Fatal, slog.Default, os.Getenv, time.Second
	_                   = io.Discard
	_, _, _, _, _       = pgx.BeginFunc, pgxpool.New, otelpgxtx.ScopeName, outcome.PhaseActive, reconcile.New
)
`

// TestSnippetsCompile: every go block of README.md and of docs/ builds against the
// checkout, as a reader would copy it. A whole program (it begins with its package
// clause) is built as it is; any other block must be marked a fragment ("go fragment" on
// its fence) and is built as the body of a function of a package that declares what an
// application has at hand (fragmentPrelude: ctx, dsn, out, cfg, pool, recPool, rec, pending, transfer,
// resume, publishOrderCreated) — so a variable it declares and never uses fails, as it would in the reader's
// code; the function returns an error, so that a fragment may return one. A fragment
// marked with an example's name ("go fragment ExampleRetry") must also be that tested
// example's code, line for line; one marked with a program's path ("go fragment
// examples/quickstart/main.go"), lines of that program.
func TestSnippetsCompile(t *testing.T) {
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	overlay := map[string]string{}
	var fragments strings.Builder
	fragments.WriteString(fragmentPrelude)
	var programs []string
	var nFragments, nExamples int
	for i, s := range snippets(t) {
		where := fmt.Sprintf("%s:%d", filepath.Base(s.page), s.line)
		switch {
		case strings.HasPrefix(s.code, "package "):
			if len(s.info) != 0 {
				t.Errorf("%s: a whole program marked %q", where, s.info)
			}
			src := filepath.Join(dir, fmt.Sprintf("program%d.go", i))
			if err := os.WriteFile(src, []byte(s.code), 0o644); err != nil {
				t.Fatal(err)
			}
			pkg := fmt.Sprintf("testdata/program%d", i)
			overlay[filepath.Join(repo, "docs", pkg, "main.go")] = src
			programs = append(programs, "./"+pkg)
		case len(s.info) == 0 || s.info[0] != "fragment":
			t.Errorf("%s: a go block that is neither a whole program nor marked a fragment (\"go fragment\")", where)
		default:
			// The //line comment has the compiler's errors name the page and its line.
			fmt.Fprintf(&fragments, "\nfunc _() error {\n//line %s:%d\n%sreturn nil\n}\n", filepath.Base(s.page), s.line, s.code)
			nFragments++
			if len(s.info) > 1 {
				if strings.HasSuffix(s.info[1], ".go") {
					sameAsFile(t, where, s.code, s.info[1])
				} else {
					sameAsExample(t, where, s.code, s.info[1])
				}
				nExamples++
			}
		}
	}
	// The README alone has two fragments, each lines of the quickstart program: fewer
	// means the pages were not read, and the test proved nothing.
	if nFragments < 7 || nExamples < 3 {
		t.Fatalf("read %d fragments, %d of them an example's code: want at least 7 and 3", nFragments, nExamples)
	}
	src := filepath.Join(dir, "fragments.go")
	if err := os.WriteFile(src, []byte(fragments.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	overlay[filepath.Join(repo, "docs", "testdata", "fragments.go")] = src
	ov, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ovFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovFile, ov, 0o644); err != nil {
		t.Fatal(err)
	}
	// The snippets are laid over testdata/, which holds no Go file of its own: they build
	// as packages of the checkout's module, with its versions of everything.
	for _, pkg := range append([]string{"./testdata"}, programs...) {
		cmd := exec.Command("go", "build", "-o", os.DevNull, "-overlay", ovFile, pkg)
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	}
}

// sameAsExample checks that code is, line for line (indentation aside), part of the body
// of the example function name in one of the module's test files.
func sameAsExample(t *testing.T, where, code, name string) {
	t.Helper()
	if containsRun(exampleBody(t, name), codeLines(code)) {
		return
	}
	want := codeLines(code)
	t.Errorf("%s: the fragment is not the code of %s, line for line:\n%s", where, name, strings.Join(want, "\n"))
}

// sameAsFile checks that code is, line for line (indentation aside), a run of lines of
// the program at path (from the repository's root), so that what a reader copies is what
// a test builds and runs.
func sameAsFile(t *testing.T, where, code, path string) {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", filepath.FromSlash(path)))
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if !containsRun(codeLines(string(src)), codeLines(code)) {
		t.Errorf("%s: the fragment is not lines of %s, line for line:\n%s", where, path, code)
	}
}

// containsRun reports whether want is a contiguous run of lines.
func containsRun(lines, want []string) bool {
	for i := 0; i+len(want) <= len(lines); i++ {
		if slices.Equal(lines[i:i+len(want)], want) {
			return true
		}
	}
	return false
}

// exampleBody returns the lines of the body of the example function name, found in the
// module's test files.
func exampleBody(t *testing.T, name string) []string {
	t.Helper()
	files, err := filepath.Glob("../*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("../*/*_test.go")
	for _, f := range append(files, more...) {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, f, src, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == name && fn.Body != nil {
				return codeLines(string(src[fset.Position(fn.Body.Lbrace).Offset+1 : fset.Position(fn.Body.Rbrace).Offset]))
			}
		}
	}
	t.Fatalf("no example %s in the module's test files", name)
	return nil
}

// codeLines returns code's lines, trimmed, without the empty ones.
func codeLines(code string) []string {
	var out []string
	for l := range strings.SplitSeq(code, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}
