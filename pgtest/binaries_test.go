package pgtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeBinDir creates root/<version>/bin with the given (empty, executable)
// programs.
func fakeBinDir(t *testing.T, root, version string, programs ...string) string {
	t.Helper()
	dir := filepath.Join(root, version, "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range programs {
		if err := os.WriteFile(filepath.Join(dir, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestFindBinariesMissing(t *testing.T) {
	t.Setenv("PATH", "")
	root := t.TempDir()
	fakeBinDir(t, root, "15", "initdb", "pg_ctl") // no postgres: incomplete
	glob := filepath.Join(root, "*", "bin")

	_, err := findBinariesIn(glob)
	if err == nil {
		t.Fatal("findBinariesIn succeeded without binaries")
	}
	for _, want := range []string{"apt-get install postgresql", glob, "PATH", "pg_config"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestFindBinariesHighestVersion(t *testing.T) {
	t.Setenv("PATH", "")
	root := t.TempDir()
	all := []string{"initdb", "pg_ctl", "postgres"}
	fakeBinDir(t, root, "9.6", all...)
	want := fakeBinDir(t, root, "15", all...)
	fakeBinDir(t, root, "10", all...)
	fakeBinDir(t, root, "16", "initdb") // newer but incomplete

	b, err := findBinariesIn(filepath.Join(root, "*", "bin"))
	if err != nil {
		t.Fatal(err)
	}
	if got := filepath.Dir(b.postgres); got != want {
		t.Errorf("picked %s, want %s", got, want)
	}
}

func TestFindBinariesOnThisMachine(t *testing.T) {
	b, err := findBinaries()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("using %+v", b)
}

func TestFindBinariesFromEnv(t *testing.T) {
	root := t.TempDir()
	want := fakeBinDir(t, root, "18", "initdb", "pg_ctl", "postgres")
	t.Setenv(BinEnv, want)
	b, err := findBinaries()
	if err != nil {
		t.Fatal(err)
	}
	if got := filepath.Dir(b.postgres); got != want {
		t.Errorf("picked %s, want %s", got, want)
	}

	// A wrong directory is an error naming it, not the machine's own server instead.
	bad := fakeBinDir(t, root, "13", "initdb")
	t.Setenv(BinEnv, bad)
	if _, err := findBinaries(); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), BinEnv) {
		t.Errorf("findBinaries with %s=%s: err = %v, want one naming both", BinEnv, bad, err)
	}
}
