package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeLimits are the README's rules for a reader who adopts the library from it in five
// minutes: its length, a sentence's, and the retry fragment's.
const (
	readmeMaxLines    = 150
	sentenceMaxWords  = 30
	retryMaxLines     = 15
	readmeMinSentence = 40 // fewer sentences read means the scan is broken
)

var (
	// testName is a name of a test, benchmark, fuzz target or example function.
	testName = regexp.MustCompile(`\b(Test|Benchmark|Fuzz|Example)[A-Z_]\w*`)
	// sqlFunction is the name of one of PostgreSQL's own functions.
	sqlFunction = regexp.MustCompile(`\bpg_[a-z_]+`)
	mdLink      = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	sentenceEnd = regexp.MustCompile(`[.!?:;](\s|$)`)
)

// TestReadmeForUsers: the README is a user's document. It is at most readmeMaxLines
// lines; it names no test and no SQL function (those, and the proofs, are docs/'s); each
// sentence of its prose is at most sentenceMaxWords words; the safe retry's fragment is at
// most retryMaxLines lines; it shows the trace picture and links every page of docs/; and
// each page of docs/ opens, under its title, with whom it is for.
func TestReadmeForUsers(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	if n := strings.Count(readme, "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, want at most %d", n, readmeMaxLines)
	}
	for _, m := range testName.FindAllString(readme, -1) {
		t.Errorf("README.md names %s: test names belong in docs/", m)
	}
	for _, m := range sqlFunction.FindAllString(readme, -1) {
		t.Errorf("README.md names the SQL function %s: it belongs in docs/", m)
	}
	sentences := 0
	for _, line := range proseLines(t, "../README.md") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "|") || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "![") {
			continue
		}
		line = mdLink.ReplaceAllString(strings.TrimPrefix(line, "- "), "$1")
		for _, s := range sentenceEnd.Split(line, -1) {
			if words := len(strings.Fields(s)); words > sentenceMaxWords {
				t.Errorf("README.md: a sentence of %d words, want at most %d: %q", words, sentenceMaxWords, s)
			} else if words > 0 {
				sentences++
			}
		}
	}
	if sentences < readmeMinSentence {
		t.Errorf("read %d sentences of README.md: the scan is broken", sentences)
	}
	retry := ""
	for _, m := range goBlock.FindAllStringSubmatch(readme, -1) {
		if strings.Contains(m[2], "otelpgxtx.Retry(") {
			retry = m[2]
		}
	}
	if retry == "" {
		t.Error("README.md has no go block calling otelpgxtx.Retry")
	} else if n := strings.Count(retry, "\n"); n > retryMaxLines {
		t.Errorf("the README's retry fragment is %d lines, want at most %d", n, retryMaxLines)
	}
	if !strings.Contains(readme, "](docs/trace.png)") {
		t.Error("README.md does not show docs/trace.png")
	}
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		if !strings.Contains(readme, "](docs/"+p+")") {
			t.Errorf("README.md does not link docs/%s", p)
		}
		page, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitN(string(page), "\n", 4)
		if len(lines) < 3 || !strings.HasPrefix(lines[0], "# ") || !strings.HasPrefix(lines[2], "*For ") {
			t.Errorf("docs/%s does not open, under its title, with whom it is for (\"*For …*\")", p)
		}
	}
}
