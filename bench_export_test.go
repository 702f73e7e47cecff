package otelpgxtx

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// benchExportWorkloads are BEGIN, one parameterized INSERT and COMMIT, the transaction the
// end-to-end c ≤ b target is measured with: in pgx's default query mode, where the INSERT is prepared once
// per connection, and in QueryExecModeDescribeExec (PgBouncer's transaction mode wants it
// or another mode without named statements), where pgx prepares it in every transaction.
var benchExportWorkloads = []struct {
	w        benchWorkload
	variants []string
}{
	{benchWorkload{"insert", pgx.TxOptions{}, benchInsert, 0}, []string{benchA, benchB, benchC, benchI}},
	{benchWorkload{"insert_describe", pgx.TxOptions{}, benchInsert, pgx.QueryExecModeDescribeExec},
		[]string{benchA, benchB, benchC, benchJ, benchI}},
}

// benchInsert: BEGIN, insert, COMMIT.
func benchInsert(ctx context.Context, tx pgx.Tx, key int64) error {
	_, err := tx.Exec(ctx, "insert into bench_log (k, v) values ($1, $2)", key, key)
	return err
}

// benchExportGoroutines are BenchmarkTxExport's concurrencies
// ($OTELPGXTX_BENCH_EXPORT_GOROUTINES).
func benchExportGoroutines(b *testing.B) []int {
	return benchList(b, "OTELPGXTX_BENCH_EXPORT_GOROUTINES", "1,8,64", strconv.Atoi)
}

// BenchmarkTxExport runs benchExportWorkloads from g goroutines over a pool of g
// connections, sampled, with the spans exported two ways
// (BenchmarkTxExport/g=<n>/<workload>/<exporter>/v=<variant>): "discard", the batch span
// processor and a discarding exporter as in BenchmarkTx; "otlp", the batch span processor
// and otlptracehttp to a Jaeger v2 this benchmark starts (in-memory storage), with the
// SDK's defaults. client-µs/tx is this process's CPU time, the exporter's marshalling and
// HTTP included; exported/op below spans/op means the processor's queue overflowed.
func BenchmarkTxExport(b *testing.B) {
	admin := benchSchema(b)
	endpoint := benchStartJaeger(b)
	samplings := []benchSampling{
		{"discard", sdktrace.AlwaysSample, nil},
		{"otlp", sdktrace.AlwaysSample, func(tb testing.TB) sdktrace.SpanExporter {
			exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpoint(endpoint), otlptracehttp.WithInsecure())
			if err != nil {
				tb.Fatal(err)
			}
			return exp
		}},
	}
	for _, g := range benchExportGoroutines(b) {
		b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) {
			for _, ew := range benchExportWorkloads {
				benchEach(b, admin, srv.ConnString(), g, []benchWorkload{ew.w}, samplings, ew.variants,
					func(b *testing.B, d *benchDB, admin *pgx.Conn) { benchLoop(b, d, admin, g) })
			}
		})
	}
}

// benchStartJaeger starts the Jaeger v2 that scripts/jaeger builds and caches (or
// $OTELPGXTX_JAEGER), with an OTLP/HTTP receiver and in-memory storage on 127.0.0.1, until
// b ends, and returns the receiver's address once Jaeger is healthy.
func benchStartJaeger(b *testing.B) string {
	bin := os.Getenv("OTELPGXTX_JAEGER")
	if bin == "" {
		out, err := exec.Command("scripts/jaeger").Output() // builds it the first time
		if err != nil {
			b.Fatalf("scripts/jaeger: %v", err)
		}
		bin = strings.TrimSpace(string(out))
	}
	var addrs [2]string // the OTLP/HTTP receiver, the health check
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		addrs[i] = l.Addr().String()
		l.Close()
	}
	// JSON is YAML: the collector reads it as its configuration.
	conf, err := json.Marshal(map[string]any{
		"service": map[string]any{
			"extensions": []string{"jaeger_storage", "healthcheckv2"},
			"pipelines": map[string]any{"traces": map[string]any{
				"receivers": []string{"otlp"}, "processors": []string{"batch"}, "exporters": []string{"jaeger_storage_exporter"}}},
			"telemetry": map[string]any{"metrics": map[string]any{"level": "none"}, "traces": map[string]any{"level": "none"}},
		},
		"extensions": map[string]any{
			"healthcheckv2": map[string]any{"use_v2": true, "http": map[string]any{"endpoint": addrs[1]}},
			"jaeger_storage": map[string]any{"backends": map[string]any{
				"memstore": map[string]any{"memory": map[string]any{"max_traces": 20000}}}},
		},
		"receivers":  map[string]any{"otlp": map[string]any{"protocols": map[string]any{"http": map[string]any{"endpoint": addrs[0]}}}},
		"processors": map[string]any{"batch": map[string]any{}},
		"exporters":  map[string]any{"jaeger_storage_exporter": map[string]any{"trace_storage": "memstore"}},
	})
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	confPath := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(confPath, conf, 0o600); err != nil {
		b.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "jaeger.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", "file:"+confPath)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan struct{}) // closed when it has exited, with waitErr
	var waitErr error
	go func() { waitErr = cmd.Wait(); log.Close(); close(exited) }()
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second): // its storage is in memory: nothing to wait for
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	client := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(60 * time.Second); ; {
		resp, err := client.Get("http://" + addrs[1] + "/status")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addrs[0]
			}
		}
		select {
		case <-exited:
			logText, _ := os.ReadFile(filepath.Join(dir, "jaeger.log"))
			b.Fatalf("jaeger exited (%v):\n%s", waitErr, logText)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Fatal("jaeger was not healthy within 60 s")
		}
	}
}
