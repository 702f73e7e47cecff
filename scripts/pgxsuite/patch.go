package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// edit replaces the one occurrence of old in a file of the copy with new. An anchor that
// is missing or not unique means pgx changed: the harness stops and says which, rather
// than run the tests without its hooks.
type edit struct {
	file     string // relative to the module root
	old, new string
}

// hookEdits are the whole run-time patch of pgx: four hook variables, called where
// pgx.ParseConfig and pgxpool.ParseConfig return a configuration, where pgx starts to make
// a connection and where it has made one. pgxpool.ParseConfig calls ParseConfigWithOptions, which is all
// pgx.ParseConfig does, so that a pool's configuration is instrumented once, as a pool.
var hookEdits = []edit{
	{
		file: "conn.go",
		old: `func ParseConfig(connString string) (*ConnConfig, error) {
	return ParseConfigWithOptions(connString, ParseConfigOptions{})
}
`,
		new: `func ParseConfig(connString string) (*ConnConfig, error) {
	config, err := ParseConfigWithOptions(connString, ParseConfigOptions{})
	if err == nil && OtelpgxtxParseHook != nil {
		OtelpgxtxParseHook(config)
	}
	return config, err
}

// The Otelpgxtx… hooks are added by otelpgxtx's pgxsuite harness.
var (
	OtelpgxtxParseHook, OtelpgxtxConnectHook func(*ConnConfig)
	OtelpgxtxConnectedHook                   func(*Conn)
)
`,
	},
	{
		file: "conn.go",
		old: `func connect(ctx context.Context, config *ConnConfig) (c *Conn, err error) {
`,
		new: `func connect(ctx context.Context, config *ConnConfig) (c *Conn, err error) {
	if OtelpgxtxConnectHook != nil {
		OtelpgxtxConnectHook(config)
	}
`,
	},
	{
		file: "conn.go",
		old: `	return c, nil
}

// Close closes a connection.`,
		new: `	if OtelpgxtxConnectedHook != nil {
		OtelpgxtxConnectedHook(c)
	}
	return c, nil
}

// Close closes a connection.`,
	},
	{
		file: "pgxpool/pool.go",
		old: `	connConfig, err := pgx.ParseConfig(connString)
`,
		new: `	connConfig, err := pgx.ParseConfigWithOptions(connString, pgx.ParseConfigOptions{})
`,
	},
	{
		file: "pgxpool/pool.go",
		old: `	return config, nil
}
`,
		new: `	if OtelpgxtxParseHook != nil {
		OtelpgxtxParseHook(config)
	}
	return config, nil
}

// OtelpgxtxParseHook is added by otelpgxtx's pgxsuite harness.
var OtelpgxtxParseHook func(*Config)
`,
	},
}

// applyEdit applies one edit to src, or says why it cannot.
func applyEdit(src string, e edit) (string, error) {
	switch n := strings.Count(src, e.old); n {
	case 1:
		return strings.Replace(src, e.old, e.new, 1), nil
	case 0:
		return "", fmt.Errorf("pgxsuite: the patch no longer applies to %s: this pgx has no\n%s\nupdate hookEdits in scripts/pgxsuite/patch.go for it", e.file, e.old)
	default:
		return "", fmt.Errorf("pgxsuite: the patch no longer applies to %s: this pgx has %d of\n%s\nwhere the hook needs exactly one; update hookEdits in scripts/pgxsuite/patch.go", e.file, n, e.old)
	}
}

// patch applies edits to the module copy at root, in place.
func patch(root string, edits []edit) error {
	for _, e := range edits {
		path := filepath.Join(root, e.file)
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out, err := applyEdit(string(b), e)
		if err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// testMainFile is the file added to each package whose tests the harness runs: the
// package's TestMain, which hands the probe the setters of the hooks above.
const testMainFile = `// Added by otelpgxtx's scripts/pgxsuite: the probe runs this package's tests.

package %s

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/txevidence/otelpgxtx/scripts/pgxsuite/probe"
)

func TestMain(m *testing.M) {
	probe.Main(m, probe.Hooks{
		ParseConn: func(f func(*pgx.ConnConfig)) { pgx.OtelpgxtxParseHook = f },
		ParsePool: func(f func(*pgxpool.Config)) { pgxpool.OtelpgxtxParseHook = f },
		Connect:   func(f func(*pgx.ConnConfig)) { pgx.OtelpgxtxConnectHook = f },
		Connected: func(f func(*pgx.Conn)) { pgx.OtelpgxtxConnectedHook = f },
	})
}
`

// testMainName is the name of the added file; a package that has a TestMain of its own
// already cannot take it (see addTestMain).
const testMainName = "otelpgxtx_pgxsuite_test.go"

// addTestMain writes the TestMain file into the package directory dir, whose external
// test package is pkgName, after checking that no test file there declares one.
func addTestMain(dir, pkgName string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), "\nfunc TestMain(") {
			return fmt.Errorf("pgxsuite: %s declares a TestMain now; the probe's cannot be added beside it (see addTestMain in scripts/pgxsuite/patch.go)", f)
		}
	}
	return os.WriteFile(filepath.Join(dir, testMainName), fmt.Appendf(nil, testMainFile, pkgName), 0o644)
}
