package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/txevidence/otelpgxtx/scripts/pgxsuite/probe"
)

// pkgRun is one run of one package's test binary.
type pkgRun struct {
	pkg      string
	mode     string
	res      *results
	report   *probe.Report
	missing  error // why there is no report
	duration time.Duration
	exitErr  error
}

// runner runs the test binaries of the copy at root against db.
type runner struct {
	root    string
	bins    map[string]string
	db      *database
	logs    string // where each run's test2json output is kept
	timeout time.Duration

	mu   sync.Mutex // the run counter and the database's
	runs int
}

// run runs the tests of package p in mode, all of them or those matching pattern, on a
// fresh database.
func (r *runner) run(ctx context.Context, p suitePackage, mode, pattern string) (*pkgRun, error) {
	r.mu.Lock()
	dbName, err := r.db.fresh(ctx)
	r.runs++
	base := filepath.Join(r.logs, fmt.Sprintf("%02d-%s-%s", r.runs, mode, p.name()))
	r.mu.Unlock()
	if err != nil {
		return nil, err
	}
	reportPath := base + ".report.json"
	args := []string{"tool", "test2json", "-t", "-p", p.name(), r.bins[p.name()],
		"-test.v=test2json", "-test.count=1", "-test.timeout=" + r.timeout.String()}
	if pattern != "" {
		args = append(args, "-test.run="+pattern)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	// pgx's tests open files relative to their package directory, as under go test.
	cmd.Dir = filepath.Join(r.root, p.dir)
	cmd.Env = append(withoutPG(os.Environ()), r.db.env(dbName)...)
	cmd.Env = append(cmd.Env, probe.ModeEnv+"="+mode, probe.ReportEnv+"="+reportPath)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	start := time.Now()
	exitErr := cmd.Run()
	run := &pkgRun{pkg: p.name(), mode: mode, duration: time.Since(start), exitErr: exitErr}
	if err := os.WriteFile(base+".json", out.Bytes(), 0o644); err != nil {
		return nil, err
	}
	if run.res, err = parseEvents(&out); err != nil {
		return nil, err
	}
	if !run.res.ended && exitErr != nil {
		var ee *exec.ExitError
		if !errors.As(exitErr, &ee) {
			return nil, fmt.Errorf("pgxsuite: running %s: %w\n%s", p.name(), exitErr, stderr.Bytes())
		}
	}
	run.report, run.missing = probe.ReadReport(reportPath)
	return run, nil
}

// runAll runs every suite package's tests in mode at once, as go test runs packages, and
// returns the runs by package name.
func (r *runner) runAll(ctx context.Context, mode, pattern string) (map[string]*pkgRun, error) {
	runs := make([]*pkgRun, len(suitePackages))
	errs := make([]error, len(suitePackages))
	var wg sync.WaitGroup
	for i, p := range suitePackages {
		wg.Go(func() { runs[i], errs[i] = r.run(ctx, p, mode, pattern) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	byName := map[string]*pkgRun{}
	for _, run := range runs {
		byName[run.pkg] = run
	}
	return byName, nil
}
