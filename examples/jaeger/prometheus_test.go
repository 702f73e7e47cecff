package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txevidence/otelpgxtx/pgtest"
)

// prometheusModuleVersion is the Go module version of Prometheus that scripts/prometheus
// builds (Prometheus 3.x is published as module v0.3xx.y).
const prometheusModuleVersion = "v0.316.0"

// prometheusRelease is the Prometheus release of prometheusModuleVersion: v0.316.0 is 3.16.0.
func prometheusRelease() string {
	minor, patch, _ := strings.Cut(strings.TrimPrefix(prometheusModuleVersion, "v0."), ".")
	n, _ := strconv.Atoi(minor)
	return fmt.Sprintf("3.%d.%s", n-300, patch)
}

type promProc struct {
	addr   string
	client *http.Client
}

// startPrometheus runs the Prometheus server scripts/prometheus builds, scraping target
// every second and evaluating alerts.yml every second.
func startPrometheus(t *testing.T, target string) *promProc {
	t.Helper()
	bin := toolPath(t, "OTELPGXTX_PROMETHEUS", "scripts/prometheus", "prometheus-"+prometheusModuleVersion, "prometheus")
	rules, err := filepath.Abs("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	p := &promProc{addr: freePorts(t, 1)[0], client: &http.Client{Timeout: 10 * time.Second}}
	dir := t.TempDir()
	// The job name is the one alerts_test.yml and docker-compose's prometheus.yml use.
	conf := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: otelpgxtx-demo
    static_configs:
      - targets: [%q]
`, rules, target)
	confPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+confPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+p.addr)
	runTool(t, "prometheus", dir, cmd, p.client, "http://"+p.addr+"/-/ready")
	t.Logf("prometheus %s at %s, scraping %s", prometheusRelease(), p.addr, target)
	return p
}

// api GETs path from Prometheus's HTTP API and decodes its data into v.
func (p *promProc) api(ctx context.Context, path string, q url.Values, v any) error {
	code, b, err := httpGet(ctx, p.client, p.addr, path, q)
	if err != nil {
		return err
	}
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &r); err != nil || r.Status != "success" {
		return fmt.Errorf("%s: HTTP %d %s %v", path, code, b, err)
	}
	return json.Unmarshal(r.Data, v)
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (p *promProc) query(t *testing.T, ctx context.Context, expr string) []promSample {
	t.Helper()
	var d struct {
		Result []promSample `json:"result"`
	}
	if err := p.api(ctx, "/api/v1/query", url.Values{"query": {expr}}, &d); err != nil {
		t.Fatal(err)
	}
	return d.Result
}

type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

func (p *promProc) alerts(t *testing.T, ctx context.Context, name string) []promAlert {
	t.Helper()
	var d struct {
		Alerts []promAlert `json:"alerts"`
	}
	if err := p.api(ctx, "/api/v1/alerts", nil, &d); err != nil {
		t.Fatal(err)
	}
	var out []promAlert
	for _, a := range d.Alerts {
		if a.Labels["alertname"] == name {
			out = append(out, a)
		}
	}
	return out
}

// lastEvaluation is when Prometheus last evaluated the otelpgxtx rule group; it checks
// that every rule of alerts.yml is loaded and healthy.
func (p *promProc) lastEvaluation(t *testing.T, ctx context.Context) time.Time {
	t.Helper()
	var d struct {
		Groups []struct {
			Name           string    `json:"name"`
			LastEvaluation time.Time `json:"lastEvaluation"`
			Rules          []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := p.api(ctx, "/api/v1/rules", nil, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Groups) != 1 || d.Groups[0].Name != "otelpgxtx" || len(d.Groups[0].Rules) != len(alertNames) {
		t.Fatalf("rule groups: %+v, want the otelpgxtx group of alerts.yml with its %d rules", d.Groups, len(alertNames))
	}
	for _, r := range d.Groups[0].Rules {
		if r.Health == "err" {
			t.Fatalf("rule %s: %s", r.Name, r.LastError)
		}
	}
	return d.Groups[0].LastEvaluation
}

// waitFor polls cond every 200 ms until it holds, for at most d.
func waitFor(t *testing.T, ctx context.Context, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, d)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// alertNames are the rules of alerts.yml.
var alertNames = []string{"TransactionCommitIndeterminate", "TransactionCommitUnresolved", "TransactionReconciledUnknown",
	"TransactionCommitAborted", "TransactionIndeterminateRateHigh", "TransactionRollbackRateHigh", "TransactionPostCommitFailure"}

// TestPrometheusAlert runs a real Prometheus (the release scripts/prometheus builds)
// scraping the demo's metrics endpoint and evaluating alerts.yml. Before anything went
// wrong no alert is active; after one round of the demo's scenarios the post-commit-failure
// alert fires — on the first such frame of the process, whose series appears with it, at
// 1 (the transactions are counted by the duration histogram, which has no series at 0) —,
// while the indeterminate commit, which automatic reconciliation settled committed, pages
// nobody: Prometheus holds the indeterminate series at 1 and the reconciliations series
// committed at 1, and no alert is pending or firing for them. Then a plain pgx commit cut
// the same way, which has no reference, is settled unknown (no_reference) and
// TransactionReconciledUnknown pages. The series have the names and labels docs/metrics.md
// documents.
func TestPrometheusAlert(t *testing.T) {
	ctx := pgtest.Context(t, 4*time.Minute)
	a, p, out, errOut := scrapedDemo(t, ctx, "otelpgxtx-prometheus")
	// The demo's indeterminate commit is a COMMIT's (tx_implicit="false"; autocommit
	// writes have series of their own).
	const indeterminate = `otelpgxtx_transaction_duration_seconds_count{tx_outcome="indeterminate", tx_implicit="false"}`

	// Scraped (the counters' series at 0; no transaction's yet), and the rules evaluated
	// since: nothing may be firing yet.
	var seen time.Time
	waitFor(t, ctx, time.Minute, "the participations series at 0 in Prometheus", func() bool {
		r := p.query(t, ctx, `otelpgxtx_participations_total{tx_participant_outcome="participating", tx_propagation="required"}`)
		seen = time.Now()
		return len(r) == 1 && r[0].Value[1] == "0"
	})
	if r := p.query(t, ctx, `otelpgxtx_transaction_duration_seconds_count`); len(r) != 0 {
		t.Fatalf("transactions counted before any: %v", r)
	}
	waitFor(t, ctx, time.Minute, "a rule evaluation after the first scrape", func() bool {
		return p.lastEvaluation(t, ctx).After(seen)
	})
	for _, name := range alertNames {
		if got := p.alerts(t, ctx, name); len(got) > 0 {
			t.Errorf("%s is %s before any transaction: %v", name, got[0].State, got)
		}
	}

	rep := a.round(ctx, 1)
	a.report(rep)
	if !rep.ok() {
		t.Fatalf("the demo's scenarios failed:\n%s\n%s", out.String(), errOut.String())
	}

	for _, want := range []struct{ name, outcome, severity string }{
		{"TransactionPostCommitFailure", "committed_with_post_commit_failure", "warning"},
	} {
		var got []promAlert
		waitFor(t, ctx, time.Minute, want.name+" firing", func() bool {
			got = p.alerts(t, ctx, want.name)
			return len(got) == 1 && got[0].State == "firing"
		})
		l := got[0].Labels
		if l["tx_outcome"] != want.outcome || l["severity"] != want.severity || l["job"] != "otelpgxtx-demo" ||
			l["instance"] != a.cfg.metricsAddr || l["db_system_name"] != "postgresql" {
			t.Errorf("%s labels %v", want.name, l)
		}
	}
	// The alert above may have fired from a scrape taken between the post-commit-failure
	// scenario and the indeterminate one, which runs after it: wait for a scrape that
	// saw the whole round rather than assume the alert's scrape did.
	waitFor(t, ctx, time.Minute, indeterminate+" at 1 in Prometheus (the round's one indeterminate commit)", func() bool {
		r := p.query(t, ctx, indeterminate)
		return len(r) == 1 && r[0].Value[1] == "1"
	})
	// Reconciled committed, and no outcome waits: once Prometheus has scraped that and
	// evaluated the rules since, no page is pending or firing.
	const resolved = `otelpgxtx_reconciliations_total{tx_outcome_resolved="committed"}`
	waitFor(t, ctx, time.Minute, resolved+" at 1 in Prometheus", func() bool {
		r := p.query(t, ctx, resolved)
		seen = time.Now()
		return len(r) == 1 && r[0].Value[1] == "1"
	})
	if r := p.query(t, ctx, `otelpgxtx_reconciliation_unresolved_age_seconds`); len(r) != 1 || r[0].Value[1] != "0" {
		t.Errorf("otelpgxtx_reconciliation_unresolved_age_seconds = %v, want 0", r)
	}
	if r := p.query(t, ctx, `sum(otelpgxtx_reconciliations_total) - sum(`+resolved+`)`); len(r) != 1 || r[0].Value[1] != "0" {
		t.Errorf("reconciliations other than committed: %v, want 0", r)
	}
	waitFor(t, ctx, time.Minute, "a rule evaluation after the resolution was scraped", func() bool {
		return p.lastEvaluation(t, ctx).After(seen)
	})
	for _, name := range []string{"TransactionCommitIndeterminate", "TransactionCommitUnresolved", "TransactionReconciledUnknown",
		"TransactionCommitAborted", "TransactionIndeterminateRateHigh"} {
		if got := p.alerts(t, ctx, name); len(got) > 0 {
			t.Errorf("%s is %s for an indeterminate commit reconciled committed: %v", name, got[0].State, got)
		}
	}

	// The names and labels of docs/metrics.md: one series of the duration histogram per
	// frame outcome that happened (rolled_back twice, deliberate and failure; no
	// participating, a prepared transaction's, in the demo; participating Run calls are
	// counted apart), for BEGIN … COMMIT and for implicit transactions (tx_implicit), and
	// the commit duration histogram by tx.outcome.
	var outcomes []string
	for _, s := range p.query(t, ctx, `otelpgxtx_transaction_duration_seconds_count{job="otelpgxtx-demo"}`) {
		outcomes = append(outcomes, s.Metric["tx_implicit"]+" "+s.Metric["tx_outcome"]+" "+s.Metric["tx_rollback"])
		if s.Metric["db_system_name"] != "postgresql" {
			t.Errorf("series %v: want db_system_name=postgresql", s.Metric)
		}
	}
	// The round's: its BEGIN … COMMIT frames end every way but participating; its two
	// autocommit writes commit, then fail on a duplicate key.
	want := []string{"false committed ", "false committed_with_post_commit_failure ", "false indeterminate ",
		"false rolled_back deliberate", "false rolled_back failure", "true committed ", "true rolled_back failure"}
	slices.Sort(outcomes)
	if !slices.Equal(outcomes, want) {
		t.Errorf("otelpgxtx_transaction_duration_seconds_count has tx_implicit, tx_outcome and tx_rollback %q, want %q", outcomes, want)
	}
	// The demo's one participating call, and its deliberate rollback.
	for q, v := range map[string]string{
		`otelpgxtx_participations_total{tx_participant_outcome="participating", tx_propagation="required"}`:                     "1",
		`otelpgxtx_transaction_duration_seconds_count{tx_outcome="rolled_back", tx_rollback="deliberate", tx_implicit="false"}`: "1",
	} {
		if r := p.query(t, ctx, q); len(r) != 1 || r[0].Value[1] != v {
			t.Errorf("%s = %v, want %s", q, r, v)
		}
	}
	var names []string
	if err := p.api(ctx, "/api/v1/label/__name__/values", url.Values{"match[]": {`{__name__=~"otelpgxtx_.*"}`}}, &names); err != nil {
		t.Fatal(err)
	}
	wantNames := []string{"otelpgxtx_participations_total", "otelpgxtx_reconciliations_total",
		"otelpgxtx_reconciliation_unresolved", "otelpgxtx_reconciliation_unresolved_age_seconds"}
	for _, h := range []string{"otelpgxtx_transaction_commit_duration_seconds", "otelpgxtx_transaction_duration_seconds",
		"otelpgxtx_reconciliation_duration_seconds"} {
		wantNames = append(wantNames, h+"_bucket", h+"_count", h+"_sum")
	}
	slices.Sort(wantNames)
	if !slices.Equal(names, wantNames) {
		t.Errorf("otelpgxtx series names %v, want %v", names, wantNames)
	}
	for _, h := range []string{"otelpgxtx_transaction_duration_seconds_count", "otelpgxtx_transaction_commit_duration_seconds_count"} {
		r := p.query(t, ctx, h+`{tx_outcome="indeterminate", tx_implicit="false"}`)
		if len(r) != 1 || r[0].Value[1] != "1" {
			t.Errorf("%s{tx_outcome=\"indeterminate\"} = %v, want 1", h, r)
		}
	}
	// A page that does fire: a plain pgx transaction (no reference: nothing for
	// reconciliation to ask) whose COMMIT is cut the same way ends unknown, no_reference.
	if err := plainIndeterminate(ctx, a); err != nil {
		t.Fatal(err)
	}
	var unknown []promAlert
	waitFor(t, ctx, time.Minute, "TransactionReconciledUnknown firing", func() bool {
		unknown = p.alerts(t, ctx, "TransactionReconciledUnknown")
		return len(unknown) == 1 && unknown[0].State == "firing"
	})
	if l := unknown[0].Labels; l["error_type"] != "no_reference" || l["severity"] != "page" || l["tx_outcome_resolved"] != "unknown" {
		t.Errorf("TransactionReconciledUnknown labels %v", l)
	}
}

// scrapedDemo starts the demo serving its metrics (its traces go nowhere: nothing listens
// at the OTLP endpoint) and a real Prometheus scraping it; both stop when t ends.
func scrapedDemo(t *testing.T, ctx context.Context, service string) (a *app, p *promProc, out, errOut *syncBuffer) {
	t.Helper()
	ports := freePorts(t, 2)
	out, errOut = &syncBuffer{}, &syncBuffer{}
	a, err := newApp(ctx, config{
		databaseURL: srv.ConnString(), otlpEndpoint: "http://" + ports[0], otlpProtocol: protoHTTP,
		serviceName: service, metricsAddr: ports[1], tree: treeNever, scenarioTimeout: time.Minute,
	}, out, errOut)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.close(context.WithoutCancel(ctx)); err != nil {
			t.Error(err)
		}
	})
	return a, startPrometheus(t, ports[1]), out, errOut
}

// plainIndeterminate makes a plain pgx transaction on the demo's pool whose COMMIT waits
// for the phantom synchronous standby, and terminates its backend there.
func plainIndeterminate(ctx context.Context, a *app) error {
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "set local synchronous_commit = on"); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf("insert into %s (id, k, note) values (9001, 9001, 'plain')", a.table)); err != nil {
		return err
	}
	pid := tx.Conn().PgConn().PID()
	watched := make(chan error, 1)
	go func() {
		err := a.ctl.WaitForWaitEvent(ctx, pid, "SyncRep")
		if err == nil {
			err = a.ctl.Terminate(ctx, pid)
		}
		watched <- err
	}()
	if err := tx.Commit(ctx); err == nil {
		return fmt.Errorf("the terminated COMMIT succeeded")
	}
	return <-watched
}
