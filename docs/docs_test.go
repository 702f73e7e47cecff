// Package docs holds the project's documentation pages; its test checks that they hold
// together: every link between pages resolves, every alert rule links to its section of
// the runbook, and `make fuzz` runs every fuzz target, as testing.md says; that the
// repository tracks nothing built; and that the public packages export what
// testdata/exported.txt lists (api.md).
package docs

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// repoURL is where the pages live once pushed: a link to a file of this repository there
// (an alert rule's runbook_url, say) is checked against the checkout.
const repoURL = "https://github.com/txevidence/otelpgxtx/blob/main/"

// skipped reports whether the walk of the repository from its root ("..") leaves out
// directory d at path: hidden ones, test data and the benchmark runs.
func skipped(path string, d fs.DirEntry) bool {
	name := d.Name()
	return d.IsDir() && path != ".." && (strings.HasPrefix(name, ".") || name == "testdata" || path == filepath.Join("..", "bench"))
}

// repoFiles returns the files of the repository whose names end in suffix, as paths from
// this directory ("../…"), leaving out the directories skipped says.
func repoFiles(t *testing.T, suffix string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if skipped(path, d) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), suffix) {
			out = append(out, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// pages are the Markdown files of the repository, relative to its root.
func pages(t *testing.T) []string {
	t.Helper()
	out := repoFiles(t, ".md")
	if len(out) < 2 {
		t.Fatalf("found only %v: the walk is broken", out)
	}
	return out
}

var (
	headingRe = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	fenceRe   = regexp.MustCompile("^\\s*(```|~~~)")
	// linkRe finds inline links and images, [text](target); the text may hold `code`.
	linkRe  = regexp.MustCompile(`\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	notSlug = regexp.MustCompile(`[^\p{L}\p{N}\- _]`)
)

// slug is GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and
// underscores kept), each space a hyphen.
func slug(heading string) string {
	s := strings.ToLower(heading)
	s = notSlug.ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}

// proseLines returns the lines of a Markdown file outside its code fences.
func proseLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	inFence := false
	for _, line := range strings.Split(string(b), "\n") {
		if fenceRe.MatchString(line) {
			inFence = !inFence
		} else if !inFence {
			out = append(out, line)
		}
	}
	return out
}

// anchors returns the anchors of a Markdown file's headings, with GitHub's -1, -2 … for
// repeated ones; headings inside code fences do not count.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(t, path) {
		if m := headingRe.FindStringSubmatch(line); m != nil {
			a := slug(m[1])
			if n := seen[a]; n > 0 {
				out[a+"-"+strconv.Itoa(n)] = true
			} else {
				out[a] = true
			}
			seen[a]++
		}
	}
	return out
}

// links returns the link targets of a Markdown file outside code fences and code spans.
func links(t *testing.T, path string) []string {
	t.Helper()
	var out []string
	codeSpan := regexp.MustCompile("`[^`]*`")
	for _, line := range proseLines(t, path) {
		// Link text may be code, [`x`](y); a code span never holds a link.
		line = codeSpan.ReplaceAllStringFunc(line, func(s string) string {
			return strings.Repeat("x", len(s))
		})
		for _, m := range linkRe.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// checkTarget reports whether target, a link in the file from, resolves in the checkout:
// the file (or directory) exists and, for a Markdown file, the anchor names a heading.
func checkTarget(t *testing.T, from, target string) {
	t.Helper()
	if strings.HasPrefix(target, repoURL) {
		target = filepath.Join("..", strings.TrimPrefix(target, repoURL))
		from = filepath.Join("..", "x")
	} else if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return // outside the repository
	}
	file, anchor, _ := strings.Cut(target, "#")
	path := from
	if file != "" {
		path = filepath.Join(filepath.Dir(from), filepath.FromSlash(file))
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s: link %q: %v", from, target, err)
			return
		}
	}
	if anchor == "" {
		return
	}
	if !strings.HasSuffix(path, ".md") {
		t.Errorf("%s: link %q has an anchor into a file that is not Markdown", from, target)
		return
	}
	if !anchors(t, path)[anchor] {
		t.Errorf("%s: link %q: no heading of %s has the anchor #%s", from, target, path, anchor)
	}
}

// TestLinks: every relative link between the pages names a file of the checkout and, with
// an anchor, a heading of that page.
func TestLinks(t *testing.T) {
	n := 0
	for _, p := range pages(t) {
		for _, l := range links(t, p) {
			checkTarget(t, p, l)
			n++
		}
	}
	if n < 20 {
		t.Errorf("found only %d links: the scan is broken", n)
	}
}

// TestAlertRunbooks: every alert rule of examples/jaeger/alerts.yml carries a runbook_url
// annotation that names its own section of docs/runbook.md (the anchor of a heading that is
// the alert's name).
func TestAlertRunbooks(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "examples", "jaeger", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	alertRe := regexp.MustCompile(`(?m)^\s*- alert:\s*(\S+)\s*$`)
	runbookRe := regexp.MustCompile(`(?m)^\s*runbook_url:\s*(\S+)\s*$`)
	text := string(b)
	idx := alertRe.FindAllStringSubmatchIndex(text, -1)
	if len(idx) < 7 {
		t.Fatalf("found %d alert rules in alerts.yml, want at least 7", len(idx))
	}
	runbook := anchors(t, "runbook.md")
	for i, m := range idx {
		name := text[m[2]:m[3]]
		end := len(text)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		urls := runbookRe.FindAllStringSubmatch(text[m[1]:end], -1)
		if len(urls) != 1 {
			t.Errorf("%s: %d runbook_url annotations, want 1", name, len(urls))
			continue
		}
		want := repoURL + "docs/runbook.md#" + slug(name)
		if urls[0][1] != want {
			t.Errorf("%s: runbook_url %s, want %s", name, urls[0][1], want)
		}
		if !runbook[slug(name)] {
			t.Errorf("%s: docs/runbook.md has no section %q", name, name)
		}
	}
}

// TestSlug pins the anchor rule on headings these pages use.
func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"TransactionCommitIndeterminate":                                  "transactioncommitindeterminate",
		"The command: `otelpgxtx reconcile`":                              "the-command-otelpgxtx-reconcile",
		"The commit marker and `-assert-marker`":                          "the-commit-marker-and--assert-marker",
		"The operator's dashboard":                                        "the-operators-dashboard",
		"Keeping every transaction that did not commit: tail sampling":    "keeping-every-transaction-that-did-not-commit-tail-sampling",
		"A commit acknowledged under asynchronous replication, then lost": "a-commit-acknowledged-under-asynchronous-replication-then-lost",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

// TestMakeFuzzRunsEveryFuzzTarget: testing.md promises that `make fuzz` runs every fuzz
// target; a target that moved or was renamed would otherwise leave a recipe line that
// fuzzes nothing (go test only warns) and a target that is never fuzzed.
func TestMakeFuzzRunsEveryFuzzTarget(t *testing.T) {
	fuzzFunc := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(\w+ \*testing\.F\)`)
	want := map[string]bool{}
	for _, path := range repoFiles(t, "_test.go") {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		dir, err := filepath.Rel("..", filepath.Dir(path))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range fuzzFunc.FindAllStringSubmatch(string(src), -1) {
			want[m[1]+" "+dir] = true
		}
	}
	if len(want) == 0 {
		t.Fatal("no fuzz target found: the walk is broken")
	}
	makefile, err := os.ReadFile(filepath.Join("..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	recipe := regexp.MustCompile(`-fuzz (\w+) -fuzztime \S+ (\S+)`)
	got := map[string]bool{}
	for _, m := range recipe.FindAllStringSubmatch(string(makefile), -1) {
		got[m[1]+" "+filepath.Clean(m[2])] = true
	}
	for k := range want {
		if !got[k] {
			t.Errorf("make fuzz does not run %s", k)
		}
	}
	for k := range got {
		if !want[k] {
			t.Errorf("make fuzz runs %s, which is no fuzz target", k)
		}
	}
}

// scratch is a directory with the repository as ../otelpgxtx of a new module, my-service,
// as the docs' install blocks expect, and the environment to run them in (GOBIN its bin).
type scratch struct {
	dir, svc, bin string
	env           []string
}

func newScratch(t *testing.T) scratch {
	t.Helper()
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(repo, filepath.Join(dir, "otelpgxtx")); err != nil {
		t.Fatal(err)
	}
	s := scratch{dir: dir, svc: filepath.Join(dir, "my-service"), bin: filepath.Join(dir, "bin")}
	if err := os.Mkdir(s.svc, 0o755); err != nil {
		t.Fatal(err)
	}
	s.env = append(os.Environ(), "GOBIN="+s.bin, "GOWORK=off", "GOFLAGS=")
	s.run(t, s.svc, "go", "mod", "init", "example.com/my-service")
	return s
}

// run runs name with args in dir, and fails the test if it fails.
func (s scratch) run(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, s.env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// TestBuildCommandAsDocumented runs the runbook's two ways to build the operator's command,
// as written: from a checkout (here the repository, as ../otelpgxtx of a scratch directory)
// and as a tool of a module of one's own beside it; each must leave a program that runs.
func TestBuildCommandAsDocumented(t *testing.T) {
	page, err := os.ReadFile("runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, first := range []string{"cd otelpgxtx ", "cd my-service "} {
		t.Run(strings.Fields(first)[1], func(t *testing.T) {
			t.Parallel() // each builds in a directory of its own
			s := newScratch(t)
			s.run(t, s.dir, "bash", "-euo", "pipefail", "-c", shBlock(t, string(page), first))
			// Built, it answers as the runbook says: nothing to reconcile is exit status 2.
			cmd := exec.Command(filepath.Join(s.bin, "otelpgxtx"), "reconcile")
			out, _ := cmd.CombinedOutput()
			if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "nothing to reconcile") {
				t.Errorf("the built otelpgxtx reconcile: %v, %q; want exit 2, nothing to reconcile", cmd.ProcessState, out)
			}
		})
	}
}

// TestInstallAsDocumented runs the README's install block as written, in a module of one's
// own whose code is the README's setup (a program that instruments a pool), with the
// repository as the checkout beside it: the module then builds.
func TestInstallAsDocumented(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	setup := goBlock.FindStringSubmatch(string(page))
	if setup == nil || !strings.Contains(setup[2], "InstrumentPool") {
		t.Fatal("the README's first go block is not the setup")
	}
	s := newScratch(t)
	// The block says what it needs: a function that returns an error, ctx and dsn.
	program := "package main\n\nimport (\n\t\"context\"\n\t\"log\"\n\t\"os\"\n\n" +
		"\t\"github.com/jackc/pgx/v5/pgxpool\"\n\t\"github.com/txevidence/otelpgxtx\"\n)\n\n" +
		"func setup(ctx context.Context, dsn string) error {\n" + setup[2] + "\treturn nil\n}\n\n" +
		"func main() {\n\tif err := setup(context.Background(), os.Getenv(\"DATABASE_URL\")); err != nil {\n\t\tlog.Fatal(err)\n\t}\n}\n"
	if err := os.WriteFile(filepath.Join(s.svc, "main.go"), []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	s.run(t, s.dir, "bash", "-euo", "pipefail", "-c", shBlock(t, string(page), "cd my-service "))
	s.run(t, s.svc, "go", "build", "-o", os.DevNull, ".")
}

// shBlock returns the one ```sh block of page whose first line starts with first.
func shBlock(t *testing.T, page, first string) string {
	t.Helper()
	var found []string
	for _, b := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(page, -1) {
		if strings.HasPrefix(b[1], first) {
			found = append(found, b[1])
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d sh blocks start with %q, want 1", len(found), first)
	}
	return found[0]
}

// maxTrackedFile is the largest file the repository may track: its largest today, the
// benchmark run's raw summary, is a third of this; a compiled program is fifty times it.
const maxTrackedFile = 1 << 20

// TestNoBuildOutputsTracked: nothing built is committed — no tracked file is a compiled
// program (an ELF, Mach-O or PE executable, or a Go archive) or larger than
// maxTrackedFile. Build outputs belong in .gitignore.
func TestNoBuildOutputsTracked(t *testing.T) {
	out, err := exec.Command("git", "-C", "..", "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("listing the tracked files needs a git checkout: %v", err)
	}
	magics := [][]byte{{0x7f, 'E', 'L', 'F'}, {0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf},
		{0xce, 0xfa, 0xed, 0xfe}, {0xcf, 0xfa, 0xed, 0xfe}, {0xca, 0xfe, 0xba, 0xbe}, []byte("MZ"), []byte("!<arch>\n")}
	files := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	for _, f := range files {
		path := filepath.Join("..", f)
		info, err := os.Lstat(path)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree, or a link
		}
		if info.Size() > maxTrackedFile {
			t.Errorf("%s is tracked and %d bytes, over %d: a build output or data that belongs elsewhere", f, info.Size(), maxTrackedFile)
		}
		head := make([]byte, 8)
		fh, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := fh.Read(head)
		fh.Close()
		for _, m := range magics {
			if bytes.HasPrefix(head[:n], m) {
				t.Errorf("%s is tracked and is a compiled program or archive: remove it and add it to .gitignore", f)
			}
		}
	}
	if len(files) < 100 {
		t.Fatalf("git ls-files listed %d files; is this the repository?", len(files))
	}
}

// TestSetupNamesTheCommand: on a machine that lacks what the tests need (here npm, kept
// off the PATH), scripts/setup, the first step of make test, installs nothing when told
// to check only (-n), fails, and names the one command that installs it. (As root, make
// test runs it without -n and installs; CI's fresh machines show that.)
func TestSetupNamesTheCommand(t *testing.T) {
	bin := t.TempDir()
	for _, tool := range []string{"bash", "go", "locale", "grep", "ls", "id", "env", "gcc", "cc", "cat", "dirname"} {
		if p, err := exec.LookPath(tool); err == nil {
			if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
				t.Fatal(err)
			}
		}
	}
	cmd := exec.Command(filepath.Join("..", "scripts", "setup"), "-n")
	cmd.Env = append(os.Environ(), "PATH="+bin)
	out, err := cmd.CombinedOutput()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 {
		t.Fatalf("scripts/setup -n without npm: %v\n%s; want exit status 1", err, out)
	}
	if !regexp.MustCompile(`apt-get install -y [^"&]*\bnpm\b`).Match(out) {
		t.Errorf("scripts/setup -n without npm said:\n%s\nwant the command that installs npm", out)
	}
}
