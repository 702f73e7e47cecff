package classifier

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestCommittedLocallyTable recognises every generated translation, and only with 01000.
func TestCommittedLocallyTable(t *testing.T) {
	if len(committedLocallyDetails) < 12 {
		t.Fatalf("only %d translations", len(committedLocallyDetails))
	}
	for detail, lang := range committedLocallyDetails {
		n := &pgconn.Notice{Severity: "WARNING", SeverityUnlocalized: "WARNING", Code: sqlStateWarning, Detail: detail}
		if !CommittedLocallyNotice(n) {
			t.Errorf("%s: not recognised", lang)
		}
		n.Code = "01004"
		if CommittedLocallyNotice(n) {
			t.Errorf("%s: recognised with code %s", lang, n.Code)
		}
	}
}

// TestCommittedLocallyTableCurrent regenerates the table from this machine's PostgreSQL
// message catalogs and requires the committed one to match.
func TestCommittedLocallyTableCurrent(t *testing.T) {
	out := filepath.Join(t.TempDir(), "gen.go")
	cmd := exec.Command("go", "run", "./internal/mogen", "-o", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./internal/mogen: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("committedlocally_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("committedlocally_gen.go differs from this machine's message catalogs: run go generate ./classifier")
	}
}
