package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// defaultBinGlob is where Debian/Ubuntu packages install versioned server
// binaries; they are not on PATH by default there.
const defaultBinGlob = "/usr/lib/postgresql/*/bin"

// binaries holds the paths of the PostgreSQL programs the harness runs.
type binaries struct {
	initdb, pgCtl, postgres string
}

// BinEnv names the environment variable that points the harness at one PostgreSQL
// installation's bin directory (initdb, pg_ctl, postgres), in place of the search below:
// `make test-majors` sets it to the npm packages' builds of the oldest and newest majors
// (scripts/postgres). Set and wrong, it is an error, never a fall back to another server.
const BinEnv = "OTELPGXTX_PG_BIN"

// findBinaries locates the server programs: BinEnv's directory when set, else the
// machine's own.
func findBinaries() (binaries, error) {
	if dir := os.Getenv(BinEnv); dir != "" {
		return binariesFromEnv(dir)
	}
	return findBinariesIn(defaultBinGlob)
}

// binariesFromEnv is the installation BinEnv names, or an error that says what is
// missing there.
func binariesFromEnv(dir string) (binaries, error) {
	b, ok := inDir(dir)
	if !ok {
		return binaries{}, fmt.Errorf("%s=%q does not hold the PostgreSQL server programs (initdb, pg_ctl, postgres); "+
			"scripts/postgres MAJOR prints such a directory (it installs the npm package's build)", BinEnv, dir)
	}
	return b, nil
}

// findBinariesIn searches PATH, then `pg_config --bindir`, then the
// directories matching glob (highest version first). The glob is a parameter
// so tests can point it at a fake directory.
func findBinariesIn(glob string) (binaries, error) {
	var searched []string

	b, err := lookPathAll()
	if err == nil {
		return b, nil
	}
	searched = append(searched, fmt.Sprintf("PATH=%q", os.Getenv("PATH")))

	if pgConfig, err := exec.LookPath("pg_config"); err != nil {
		searched = append(searched, "`pg_config --bindir` (pg_config not on PATH)")
	} else if out, err := exec.Command(pgConfig, "--bindir").Output(); err != nil {
		searched = append(searched, fmt.Sprintf("`%s --bindir` (%v)", pgConfig, err))
	} else {
		dir := strings.TrimSpace(string(out))
		if b, ok := inDir(dir); ok {
			return b, nil
		}
		searched = append(searched, fmt.Sprintf("`pg_config --bindir` (%s)", dir))
	}

	dirs, _ := filepath.Glob(glob) // the only possible error is a malformed pattern
	sort.Slice(dirs, func(i, j int) bool { return versionLess(versionOf(dirs[j]), versionOf(dirs[i])) })
	for _, dir := range dirs {
		if b, ok := inDir(dir); ok {
			return b, nil
		}
	}
	searched = append(searched, glob)

	return binaries{}, fmt.Errorf("PostgreSQL server programs (initdb, pg_ctl, postgres) not found; searched %s. "+
		"Install the PostgreSQL server, e.g. `apt-get install postgresql` (Debian/Ubuntu)", strings.Join(searched, ", "))
}

// lookPathAll finds all three programs on PATH, or fails.
func lookPathAll() (binaries, error) {
	var b binaries
	for _, p := range []struct {
		name string
		dst  *string
	}{{"initdb", &b.initdb}, {"pg_ctl", &b.pgCtl}, {"postgres", &b.postgres}} {
		path, err := exec.LookPath(p.name)
		if err != nil {
			return binaries{}, err
		}
		*p.dst = path
	}
	return b, nil
}

// inDir reports the programs in dir when all three are executable files.
func inDir(dir string) (binaries, bool) {
	b := binaries{
		initdb:   filepath.Join(dir, "initdb"),
		pgCtl:    filepath.Join(dir, "pg_ctl"),
		postgres: filepath.Join(dir, "postgres"),
	}
	for _, p := range []string{b.initdb, b.pgCtl, b.postgres} {
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return binaries{}, false
		}
	}
	return b, true
}

// versionOf parses the version directory of ".../<version>/bin", e.g. "15" or
// "9.6"; non-numeric parts become -1 so they sort below real versions.
func versionOf(binDir string) []int {
	var v []int
	for _, part := range strings.Split(filepath.Base(filepath.Dir(binDir)), ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			n = -1
		}
		v = append(v, n)
	}
	return v
}

// versionLess orders versions numerically, so "10" sorts above "9.6".
func versionLess(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}
