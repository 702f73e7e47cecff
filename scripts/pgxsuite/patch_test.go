package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestApplyEdit(t *testing.T) {
	e := edit{file: "f.go", old: "a()\n", new: "a()\nb()\n"}
	got, err := applyEdit("x()\na()\n", e)
	if err != nil || got != "x()\na()\nb()\n" {
		t.Errorf("applyEdit = %q, %v", got, err)
	}
	if _, err := applyEdit("x()\n", e); err == nil || !strings.Contains(err.Error(), "no longer applies to f.go") {
		t.Errorf("a missing anchor: %v", err)
	}
	if _, err := applyEdit("a()\na()\n", e); err == nil || !strings.Contains(err.Error(), "has 2 of") {
		t.Errorf("an anchor found twice: %v", err)
	}
}

// TestHookEditsApply applies the patch to a copy of the pgx that go.mod selects, so that
// a new pgx whose code moved fails here, with the edit that no longer applies, as well as
// in the harness.
func TestHookEditsApply(t *testing.T) {
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	_, src, err := pgxSource(repo)
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	for _, f := range []string{"conn.go", "pgxpool/pool.go"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := patch(dst, hookEdits); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dst, "conn.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, hook := range []string{"OtelpgxtxParseHook(config)", "OtelpgxtxConnectHook(config)", "OtelpgxtxConnectedHook(c)"} {
		if !strings.Contains(string(b), hook) {
			t.Errorf("the patched conn.go does not call %s", hook)
		}
	}
	// A second application finds its anchors changed: the patch is applied to a fresh
	// copy only.
	if err := patch(dst, hookEdits); err == nil {
		t.Error("the patch applied twice to the same copy")
	}
}

func TestAddTestMainRefusesASecond(t *testing.T) {
	dir := t.TempDir()
	if err := addTestMain(dir, "pgx_test"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, testMainName))
	if err != nil || !strings.HasPrefix(strings.SplitN(string(b), "\n\n", 2)[1], "package pgx_test\n") {
		t.Fatalf("the TestMain file: %q, %v", b, err)
	}
	if err := addTestMain(dir, "pgx_test"); err == nil || !strings.Contains(err.Error(), "declares a TestMain") {
		t.Errorf("a package that has a TestMain: %v", err)
	}
}
