// Command pgxsuite runs pgx's own tests — the root package, pgxpool and stdlib, of the pgx
// version in the library's go.mod — against a pgtest server three ways: without any
// tracer (baseline), with otelpgxtx installed where pgx parses each configuration
// (InstrumentPool, InstrumentConnConfig), and installed when each connection is made over
// whatever tracer the test set. It fails on a test that passes in the baseline and fails
// with the library (rerun alone in both to confirm), a panic, a frame span never ended on
// a closed connection, a frame span without tx.outcome, and a call of the OpenTelemetry
// error handler.
//
// It copies pgx from the module cache to a temporary directory, adds three hook
// variables to the copy (patch.go) and a TestMain to each package that installs the probe
// (package probe), and runs the compiled test binaries through test2json.
//
//	go run ./scripts/pgxsuite [-race] [-run regexp] [-keep]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/txevidence/otelpgxtx/scripts/pgxsuite/probe"
)

func main() {
	race := flag.Bool("race", false, "build pgx's tests with the race detector")
	pattern := flag.String("run", "", "run only the tests matching this regexp (as go test -run)")
	keep := flag.Bool("keep", false, "keep the copy of pgx, the test2json output and the probe reports")
	timeout := flag.Duration("timeout", 10*time.Minute, "the timeout of each test binary run")
	flag.Parse()
	ok, err := suite(context.Background(), os.Stdout, *race, *pattern, *keep, *timeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// suite does the whole run and reports to w; ok is false when it found a problem.
func suite(ctx context.Context, w io.Writer, race bool, pattern string, keep bool, timeout time.Duration) (ok bool, err error) {
	start := time.Now()
	repo, version, src, err := locatePgx()
	if err != nil {
		return false, err
	}
	work, err := os.MkdirTemp("", "otelpgxtx-pgxsuite-")
	if err != nil {
		return false, err
	}
	if keep {
		fmt.Fprintf(w, "pgxsuite: keeping %s\n", work)
	} else {
		defer os.RemoveAll(work)
	}
	root, logs := filepath.Join(work, "pgx"), filepath.Join(work, "runs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return false, err
	}
	bins, err := buildCopy(w, start, version, src, root, repo, filepath.Join(work, "bin"), race)
	if err != nil {
		return false, err
	}

	db, err := startDatabase(ctx, src)
	if err != nil {
		return false, err
	}
	defer func() {
		if cerr := db.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	r := &runner{root: root, bins: bins, db: db, logs: logs, timeout: timeout}

	runs, err := r.runModes(ctx, w, pattern)
	if err != nil {
		return false, err
	}
	printCounts(w, runs)

	var problems []string
	problem := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	for _, p := range suitePackages {
		if err := r.judge(ctx, w, p, runs, pattern, problem); err != nil {
			return false, err
		}
	}
	for _, p := range tally(problems) {
		fmt.Fprintln(w, "FAIL: "+p)
	}
	verdict := "ok"
	if len(problems) > 0 {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "pgxsuite: %s, %s in all\n", verdict, time.Since(start).Round(time.Second))
	return len(problems) == 0, nil
}

// locatePgx returns the library's module directory, and the version and module-cache
// directory of the pgx its go.mod requires: the suite tests the pgx the library is built
// with, not another.
func locatePgx() (repo, version, src string, err error) {
	out, err := goCmd(".", nil, "list", "-m", "-f", "{{.Dir}}")
	if err != nil {
		return "", "", "", err
	}
	repo = strings.TrimSpace(string(out))
	version, src, err = pgxSource(repo)
	if err != nil {
		return "", "", "", err
	}
	return repo, version, src, nil
}

// buildCopy copies pgx from src to root, patches the copy and builds its test binaries
// into bin, and reports to w how long that took since start: the tests run from a copy
// because the module cache is read-only and shared with every other build.
func buildCopy(w io.Writer, start time.Time, version, src, root, repo, bin string, race bool) (map[string]string, error) {
	fmt.Fprintf(w, "pgxsuite: pgx %s from %s, patched copy in %s\n", version, src, root)
	if err := prepareCopy(src, root, repo); err != nil {
		return nil, err
	}
	bins, err := buildTests(root, bin, race)
	if err != nil {
		return nil, err
	}
	built := time.Since(start)
	fmt.Fprintf(w, "pgxsuite: copied, patched and built in %s\n", built.Round(time.Second))
	return bins, nil
}

// runModes runs every suite package in each mode of probe.Modes, one mode after the
// other, and returns the runs by mode and package name: the judgement compares each
// package's instrumented runs with its baseline run.
func (r *runner) runModes(ctx context.Context, w io.Writer, pattern string) (map[string]map[string]*pkgRun, error) {
	runs := map[string]map[string]*pkgRun{}
	for _, mode := range probe.Modes {
		t := time.Now()
		var err error
		if runs[mode], err = r.runAll(ctx, mode, pattern); err != nil {
			return nil, err
		}
		fmt.Fprintf(w, "pgxsuite: %s run in %s\n", mode, time.Since(t).Round(100*time.Millisecond))
	}
	return runs, nil
}

// judge reports the problems of package p's runs through problem: a test that fails or
// panics in the baseline, then what each instrumented mode did differently. A problem
// found in the baseline is pgx's or the database's, not the library's, so it is told apart.
func (r *runner) judge(ctx context.Context, w io.Writer, p suitePackage, runs map[string]map[string]*pkgRun, pattern string, problem func(format string, args ...any)) error {
	base := runs[probe.Baseline][p.name()]
	for _, name := range base.res.with(fail) {
		problem("%s %s fails in the baseline, without the library:\n%s", p.name(), name, indent(base.res.tail(name, 15)))
	}
	for _, line := range base.res.panics {
		problem("%s baseline: %s", p.name(), line)
	}
	for _, mode := range probe.Modes[1:] {
		if err := r.judgeMode(ctx, w, p, mode, base, runs[mode][p.name()], pattern, problem); err != nil {
			return err
		}
	}
	return nil
}

// judgeMode reports through problem what package p's run inst, in the instrumented mode,
// did that its baseline run base did not: a panic, a problem in the probe's report, a
// test listed as failing by construction that passed, and a regression. The expected
// failures it prints to w as such, so that a reader sees them without their failing the
// run.
func (r *runner) judgeMode(ctx context.Context, w io.Writer, p suitePackage, mode string, base, inst *pkgRun, pattern string, problem func(format string, args ...any)) error {
	for _, line := range inst.res.panics {
		problem("%s %s: %s", p.name(), mode, line)
	}
	for _, msg := range reportProblems(inst.report, inst.missing, pattern == "") {
		problem("%s %s: %s", p.name(), mode, msg)
	}
	reg, hit, stale := unexpected(byConstruction, p.name(), mode, regressions(base.res, inst.res))
	for _, e := range hit {
		fmt.Fprintf(w, "expected: %s %s: %s fails by construction: %s\n", p.name(), mode, e.test, e.why)
	}
	if pattern == "" {
		for _, e := range stale {
			problem("%s %s: %s is listed as failing by construction (byConstruction in scripts/pgxsuite/judge.go) but did not fail: remove it", p.name(), mode, e.test)
		}
	}
	if len(reg) == 0 {
		return nil
	}
	return r.judgeRegressions(ctx, w, p, mode, inst, reg, problem)
}

// judgeRegressions reruns alone the tests reg that passed in the baseline and failed in
// mode, and reports through problem those that fail again: a test that fails only in the
// full run may have failed for its neighbours or the load, not for the library, so it is
// printed to w as a note instead.
func (r *runner) judgeRegressions(ctx context.Context, w io.Writer, p suitePackage, mode string, inst *pkgRun, reg []string, problem func(format string, args ...any)) error {
	yes, no, err := r.confirm(ctx, p, mode, reg)
	if err != nil {
		return err
	}
	for _, name := range yes {
		problem("%s %s: %s passes in the baseline and ends %q with the library, in the full run and alone:\n%s",
			p.name(), mode, name, inst.res.get(name), indent(inst.res.tail(name, 15)))
	}
	for _, name := range no {
		fmt.Fprintf(w, "note: %s %s: %s passed in the baseline and ended %q with the library in the full run, but not again when rerun alone:\n%s\n",
			p.name(), mode, name, inst.res.get(name), indent(inst.res.tail(name, 15)))
	}
	return nil
}

// confirm reruns the top-level tests of regressions alone, in the baseline and in mode.
func (r *runner) confirm(ctx context.Context, p suitePackage, mode string, reg []string) (yes, no []string, err error) {
	baseAlone, instAlone := map[string]*results{}, map[string]*results{}
	for _, top := range tops(reg) {
		for m, into := range map[string]map[string]*results{probe.Baseline: baseAlone, mode: instAlone} {
			run, err := r.run(ctx, p, m, "^"+top+"$")
			if err != nil {
				return nil, nil, err
			}
			into[top] = run.res
		}
	}
	yes, no = confirmed(reg, baseAlone, instAlone)
	return yes, no, nil
}

// printCounts prints the pass, fail, skip counts and the duration of every run.
func printCounts(w io.Writer, runs map[string]map[string]*pkgRun) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tpackage\tpass\tfail\tskip\tnot run\tframes\tinstrumented conns\ttime\t")
	for _, mode := range probe.Modes {
		for _, p := range suitePackages {
			run := runs[mode][p.name()]
			ps, f, s, n := run.res.counts()
			frames, conns := "-", "-"
			if rep := run.report; rep != nil && mode != probe.Baseline {
				frames, conns = fmt.Sprint(rep.FramesStarted), fmt.Sprintf("%d/%d", rep.Instrumented, rep.Connections)
				if rep.WithReference > 0 {
					frames += fmt.Sprintf(" (%d with a reference)", rep.WithReference)
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%.1fs\t\n", mode, p.name(), ps, f, s, n, frames, conns, run.duration.Seconds())
		}
	}
	tw.Flush()
}

// indent indents a block of output for a message.
func indent(s string) string {
	if s == "" {
		return "    (no output)"
	}
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}
