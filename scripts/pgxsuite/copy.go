package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// suitePackage is one package whose tests the harness runs: its directory in the pgx
// module and its external test package's name.
type suitePackage struct {
	dir, testPkg string
}

// name is how reports call the package.
func (p suitePackage) name() string {
	if p.dir == "." {
		return "pgx"
	}
	return p.dir
}

// suitePackages are the packages of issue 25: pgx's root package, pgxpool and stdlib.
var suitePackages = []suitePackage{
	{".", "pgx_test"},
	{"pgxpool", "pgxpool_test"},
	{"stdlib", "stdlib_test"},
}

// pgxModule is the module path of pgx.
const pgxModule = "github.com/jackc/pgx/v5"

// goCmd runs the go command in dir and returns its standard output; a failure carries
// its standard error.
func goCmd(dir string, env []string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("pgxsuite: go %s (in %s): %w\n%s", strings.Join(args, " "), dir, err, stderr.Bytes())
	}
	return out, nil
}

// pgxSource returns the version of pgx the library's go.mod selects and the directory of
// that module in the module cache, downloading it if needed.
func pgxSource(repo string) (version, dir string, err error) {
	out, err := goCmd(repo, nil, "list", "-m", "-f", "{{.Version}}", pgxModule)
	if err != nil {
		return "", "", err
	}
	version = strings.TrimSpace(string(out))
	out, err = goCmd(repo, nil, "mod", "download", "-json", pgxModule+"@"+version)
	if err != nil {
		return "", "", err
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		return "", "", fmt.Errorf("pgxsuite: go mod download: %w", err)
	}
	if m.Error != "" || m.Dir == "" {
		return "", "", fmt.Errorf("pgxsuite: go mod download %s@%s: %s", pgxModule, version, m.Error)
	}
	return version, m.Dir, nil
}

// copyTree copies the module at src (read-only in the module cache) to dst, writable.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, in)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		return err
	})
}

// prepareCopy makes the patched copy of pgx at dst: the hooks, a TestMain in each suite
// package, and a go.mod that requires this repository (at repo) for the probe.
func prepareCopy(src, dst, repo string) error {
	if err := copyTree(src, dst); err != nil {
		return err
	}
	if err := patch(dst, hookEdits); err != nil {
		return err
	}
	for _, p := range suitePackages {
		if err := addTestMain(filepath.Join(dst, p.dir), p.testPkg); err != nil {
			return err
		}
	}
	const lib = "github.com/txevidence/otelpgxtx"
	if _, err := goCmd(dst, goEnv, "mod", "edit", "-require="+lib+"@v0.0.0", "-replace="+lib+"="+repo); err != nil {
		return err
	}
	_, err := goCmd(dst, goEnv, "mod", "tidy")
	return err
}

// goEnv is the environment of every go command in the copy: no workspace, and the
// copy's go.mod may be rewritten (go mod tidy).
var goEnv = []string{"GOWORK=off", "GOFLAGS=-mod=mod"}

// buildTests compiles each suite package's test binary into bin and returns their paths
// by package name. -trimpath keeps the build cache valid across runs, whose copies are in
// new temporary directories.
func buildTests(root, bin string, race bool) (map[string]string, error) {
	bins := map[string]string{}
	for _, p := range suitePackages {
		out := filepath.Join(bin, p.name()+".test")
		args := []string{"test", "-c", "-trimpath", "-o", out}
		if race {
			args = append(args, "-race")
		}
		if _, err := goCmd(root, goEnv, append(args, "./"+p.dir)...); err != nil {
			return nil, err
		}
		bins[p.name()] = out
	}
	return bins, nil
}
