package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txevidence/otelpgxtx/pgtest"
)

// srv is the throw-away PostgreSQL the tests give the demo as its DATABASE_URL, the way
// docker compose does; TestDemoEmbedded covers the demo starting its own.
var srv *pgtest.Server

// demoProcessEnv makes the test binary the demo program itself, so that a test can run
// the front service as a process of its own (startFront).
const demoProcessEnv = "OTELPGXTX_DEMO_PROCESS"

func TestMain(m *testing.M) {
	if os.Getenv(demoProcessEnv) != "" {
		main() // exits
	}
	pgtest.Main(m, &srv)
}

// syncBuffer is a bytes.Buffer for writers on several goroutines (the logger).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDemoEmbedded runs the program as `go run .` does with nothing installed but
// PostgreSQL: no DATABASE_URL (it starts its own server) and no OTLP receiver (it
// prints the trees). It must exit 0, and the trees must show what this example's README promises.
func TestDemoEmbedded(t *testing.T) {
	ctx := pgtest.Context(t, 3*time.Minute)
	var out, errOut syncBuffer
	cfg, err := parseConfig(nil, func(string) string { return "" }, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing listens on port 1: the fallback to the terminal, whatever runs on this machine.
	cfg.otlpEndpoint, cfg.otlpWait = "http://127.0.0.1:1", 0
	code := run(ctx, cfg, &out, &errOut)
	t.Logf("stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	if code != exitOK {
		t.Fatalf("exit code %d", code)
	}
	o := out.String()
	for _, want := range []string{
		"starting a throw-away server (pgtest)",
		"traces are printed instead",
		"── indeterminate: ",
		"tx.outcome=indeterminate  status=Unset",
		"tx.commit.committed_locally=true",
		"tx.phase.unknown",
		"tx.reconcile  +", // INTERNAL: no kind shown
		"tx.outcome.resolved=committed",
		"── nested_frames: ",
		"tx.frame.depth=1  tx.propagation=requires_new",
		"tx.suspended tx.operation_id=",
		"tx.savepoint.rolled_back tx.savepoint.name=",
		"tx.retry tx.attempt=2 error.type=serialization_failure",
		"tx.outcome=committed_with_post_commit_failure  status=Ok",
		`tx.post_commit  +`,
		`status=Error("transaction rolled back")`,
		"demo.results=outer=committed inner=participating",
		"Search by Tags: tx.outcome=indeterminate",
		"http://localhost:16686",
		`otelpgxtx_transaction_duration_seconds_count{tx_implicit="false",tx_outcome="indeterminate"} 1  (sum `,
		"── autocommit: ",
		// The committed write's frame is its statement's span with its outcome, kind and
		// operation id; the failed one's has a frame's attributes and phase events.
		"tx.outcome=committed  status=Ok\n", "│         tx.implicit=true  tx.operation_id=",
		"tx.phase=rolled_back  tx.implicit=true  tx.frame.depth=0",
		"demo.results=first=committed second=rolled_back",
		`otelpgxtx_transaction_duration_seconds_count{tx_implicit="true",tx_outcome="committed"} 1  (sum `,
		`otelpgxtx_transaction_duration_seconds_count{tx_implicit="true",tx_outcome="rolled_back",tx_rollback="failure"} 1  (sum `,
		`otelpgxtx_reconciliations_total{tx_outcome_resolved="committed"} 1`,
		"otelpgxtx_reconciliation_unresolved_age_seconds 0",
		"the indeterminate commit was reconciled committed in the background,",
		"so it pages nobody;",
		"Every scenario produced its expected outcome",
	} {
		if !strings.Contains(o, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// The library's log record of the indeterminate commit.
	if e := errOut.String(); !strings.Contains(e, "transaction commit outcome is indeterminate") || !strings.Contains(e, `tx.reconciliation.ref="pg:`) {
		t.Errorf("no indeterminate log record with its reference in stderr")
	}
}

func TestParseConfig(t *testing.T) {
	env := map[string]string{
		"DATABASE_URL":                "postgres://x@db/postgres",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318",
		"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		"METRICS_ADDR":                ":9464",
		"DEMO_REPEAT":                 "30s",
		"DEMO_TREE":                   "never",
	}
	cfg, err := parseConfig(nil, func(k string) string { return env[k] }, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.databaseURL != env["DATABASE_URL"] || cfg.otlpEndpoint != "http://jaeger:4318" || cfg.otlpProtocol != protoGRPC ||
		cfg.metricsAddr != ":9464" || cfg.repeat != 30*time.Second || cfg.tree != treeNever {
		t.Fatalf("config from the environment: %+v", cfg)
	}
	// The two services and the load through the front.
	for _, args := range [][]string{
		{"-serve", ":8081"},
		{"-front", ":8080", "-backend", "http://orders:8081/"},
		{"-load", "10", "-load-via", "http://front:8080/"},
	} {
		cfg, err := parseConfig(args, func(string) string { return "" }, &bytes.Buffer{})
		if err != nil || strings.HasSuffix(cfg.backendURL, "/") || strings.HasSuffix(cfg.loadVia, "/") {
			t.Errorf("%q: %+v %v", args, cfg, err)
		}
	}
	// Flags win over the environment.
	cfg, err = parseConfig([]string{"-repeat", "0", "-otlp-protocol", "http/protobuf"}, func(k string) string { return env[k] }, &bytes.Buffer{})
	if err != nil || cfg.repeat != 0 || cfg.otlpProtocol != protoHTTP {
		t.Fatalf("flags: %+v %v", cfg, err)
	}
	for _, bad := range []map[string]string{
		{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
		{"DEMO_TREE": "sometimes"},
		{"DEMO_REPEAT": "soon"},
		{"DEMO_FRONT": ":8080"}, // no backend
		{"DEMO_BACKEND": "http://orders:8081"},
		{"DEMO_FRONT": ":8080", "DEMO_BACKEND": "http://orders:8081", "DEMO_SERVE": ":8081"},
		{"DEMO_LOAD": "10", "DEMO_SERVE": ":8081"},
		{"DEMO_LOAD_VIA": "http://front:8080"}, // no load
	} {
		if _, err := parseConfig(nil, func(k string) string { return bad[k] }, &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	for in, want := range map[string]string{
		"http://jaeger:4318": "jaeger:4318",
		"jaeger:4317":        "jaeger:4317",
		"http://collector":   "collector:4318",
	} {
		if got, err := dialAddress(normalizeEndpoint(in), protoHTTP); err != nil || got != want {
			t.Errorf("dialAddress(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestComposeMatchesPgtest: docker-compose.yml runs PostgreSQL with the settings the tests'
// throw-away server has (the indeterminate scenario depends on them), the demo serves
// metrics where Prometheus scrapes them, and Prometheus loads the tested rules.
func TestComposeMatchesPgtest(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	compose := readCompose(t)
	pg := compose.Services["postgres"]
	if pg.Image != "postgres:15" {
		t.Errorf("postgres image %q", pg.Image)
	}
	settings := map[string]string{}
	for i := 0; i+1 < len(pg.Command); i++ {
		if pg.Command[i] == "-c" {
			k, v, _ := strings.Cut(pg.Command[i+1], "=")
			settings[k] = v
		}
	}
	if len(settings) == 0 {
		t.Fatalf("no -c settings in the postgres command %q", pg.Command)
	}
	conn, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, k := range []string{"synchronous_standby_names", "synchronous_commit"} {
		var got string
		if err := conn.QueryRow(ctx, "select current_setting($1)", k).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if settings[k] != got {
			t.Errorf("%s: docker-compose.yml sets %q, the tests' server (pgtest) has %q", k, settings[k], got)
		}
	}
	var version string
	if err := conn.QueryRow(ctx, "show server_version").Scan(&version); err == nil && !strings.HasPrefix(version, "15") {
		t.Logf("note: the tests ran PostgreSQL %s; docker-compose.yml runs 15", version)
	}

	demo := compose.Services["demo"]
	_, port, err := net.SplitHostPort(demo.Environment["METRICS_ADDR"])
	if err != nil {
		t.Fatalf("demo METRICS_ADDR %q: %v", demo.Environment["METRICS_ADDR"], err)
	}
	if demo.Environment["DATABASE_URL"] == "" || demo.Environment["DEMO_REPEAT"] == "" || demo.Environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == "" {
		t.Errorf("demo environment %v", demo.Environment)
	}
	prom, err := os.ReadFile("prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(prom), `"demo:`+port+`"`) {
		t.Errorf("prometheus.yml does not scrape demo:%s", port)
	}
	// Jaeger runs the tested tail-sampling pipeline (TestTailSampling).
	jg := compose.Services["jaeger"]
	if !slices.Contains(jg.Command, "file:/etc/jaeger/tail-sampling.yaml") ||
		!slices.Contains(jg.Volumes, "./examples/jaeger/tail-sampling.yaml:/etc/jaeger/tail-sampling.yaml:ro") {
		t.Errorf("jaeger does not run examples/jaeger/tail-sampling.yaml: command %q, volumes %q", jg.Command, jg.Volumes)
	}
	// Prometheus is the release the tests run (TestPrometheusAlert).
	if want := "prom/prometheus:v" + prometheusRelease(); compose.Services["prometheus"].Image != want {
		t.Errorf("prometheus image %q, want %q", compose.Services["prometheus"].Image, want)
	}
	for _, v := range compose.Services["prometheus"].Volumes {
		src := strings.Split(v, ":")[0]
		if _, err := os.Stat(filepath.Join("../..", src)); err != nil {
			t.Errorf("prometheus volume %s: %v", v, err)
		}
	}
}

// composeFile is what the tests read of docker-compose.yml.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Profiles    []string          `yaml:"profiles"`
	} `yaml:"services"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	var c composeFile
	readYAML(t, "../../docker-compose.yml", &c)
	return c
}
