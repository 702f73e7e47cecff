package docs

import (
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// update rewrites the list of the exported surface instead of comparing with it: the one
// deliberate way to add to (or remove from) what users can depend on (api.md).
var update = flag.Bool("update", false, "rewrite testdata/exported.txt from the code")

// exportedList is where the exported surface of the module's public packages is kept.
const exportedList = "testdata/exported.txt"

// publicPackages returns the directories, from the repository's root (".."), of the
// packages of the library's module that other modules can import: every directory with a
// non-test Go file, except commands (package main), internal/ trees and the directories
// of other modules (examples, scripts), which users do not import.
func publicPackages(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if skipped(path, d) || d.Name() == "internal" {
			return filepath.SkipDir
		}
		if path != ".." {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		if name := packageName(t, path); name != "" && name != "main" {
			dirs = append(dirs, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// packageName returns the package of dir's non-test Go files, or "" when it has none.
func packageName(t *testing.T, dir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly)
		if err != nil {
			t.Fatal(err)
		}
		return file.Name.Name
	}
	return ""
}

// exported lists what dir's non-test files export, one line each, "<dir> <kind> <name>":
// the top-level constants, variables, functions and types, and the exported methods and
// fields of the exported types (Type.Name), whatever the files' build constraints.
func exported(t *testing.T, dir string) []string {
	t.Helper()
	rel, err := filepath.Rel("..", dir)
	if err != nil {
		t.Fatal(err)
	}
	rel = filepath.ToSlash(rel)
	// Each file parsed on its own: parser.ParseDir, which did this, is deprecated for not
	// reading build constraints, and here every file counts whatever its constraints.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		if name := e.Name(); !e.IsDir() && strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			file, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, file)
		}
	}
	var out []string
	add := func(kind, name string) { out = append(out, rel+" "+kind+" "+name) }
	for _, file := range files {
		for _, decl := range file.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if !decl.Name.IsExported() {
					continue
				}
				if decl.Recv == nil {
					add("func", decl.Name.Name)
				} else if recv := receiverType(decl.Recv.List[0].Type); ast.IsExported(recv) {
					add("method", recv+"."+decl.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					switch spec := spec.(type) {
					case *ast.ValueSpec:
						for _, n := range spec.Names {
							if n.IsExported() {
								add(decl.Tok.String(), n.Name)
							}
						}
					case *ast.TypeSpec:
						if spec.Name.IsExported() {
							add("type", spec.Name.Name)
							members(spec, add)
						}
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// receiverType returns the name of a method receiver's type: T of T, *T, T[P] and *T[P].
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// members adds the exported fields of a struct type and the methods of an interface type
// (an embedded one by its type's name).
func members(spec *ast.TypeSpec, add func(kind, name string)) {
	var list *ast.FieldList
	kind := "field"
	switch typ := spec.Type.(type) {
	case *ast.StructType:
		list = typ.Fields
	case *ast.InterfaceType:
		list, kind = typ.Methods, "method"
	default:
		return
	}
	for _, f := range list.List {
		names := f.Names
		if len(names) == 0 {
			if id, ok := f.Type.(*ast.Ident); ok {
				names = []*ast.Ident{id}
			} else if sel, ok := f.Type.(*ast.SelectorExpr); ok {
				names = []*ast.Ident{sel.Sel}
			}
		}
		for _, n := range names {
			if n.IsExported() {
				add(kind, spec.Name.Name+"."+n.Name)
			}
		}
	}
}

// TestExportedSurface holds the exported identifiers of the public packages to the list
// in testdata/exported.txt, so that exporting one more (or a new public package) is a
// deliberate act, reviewed as a change of that list (api.md says what may be exported).
func TestExportedSurface(t *testing.T) {
	var got []string
	for _, dir := range publicPackages(t) {
		got = append(got, exported(t, dir)...)
	}
	if len(got) < 50 {
		t.Fatalf("found only %d exported identifiers: the walk is broken", len(got))
	}
	text := strings.Join(got, "\n") + "\n"
	if *update {
		if err := os.MkdirAll(filepath.Dir(exportedList), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(exportedList, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	data, err := os.ReadFile(exportedList)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	var added, removed []string
	for _, s := range got {
		if !slices.Contains(want, s) {
			added = append(added, "+ "+s)
		}
	}
	for _, s := range want {
		if !slices.Contains(got, s) {
			removed = append(removed, "- "+s)
		}
	}
	if len(added)+len(removed) > 0 {
		t.Errorf("the exported surface is not the one in docs/%s (+ exported now, not listed; - listed, no longer exported):\n%s\n"+
			"Export only what a user calls, reads or configures (docs/api.md); if the change is meant, "+
			"rewrite the list with: go test ./docs -run TestExportedSurface -update",
			exportedList, strings.Join(append(added, removed...), "\n"))
	}
}
