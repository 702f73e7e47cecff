package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.yaml.in/yaml/v3"

	"github.com/txevidence/otelpgxtx/pgtest"
)

// grafanaDashboard is what the tests read of grafana/otelpgxtx.json: its panels' queries
// and links, its links and variables.
type grafanaDashboard struct {
	UID    string `json:"uid"`
	Panels []struct {
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr       string `json:"expr"`
			RefID      string `json:"refId"`
			Datasource struct {
				Type string `json:"type"`
				UID  string `json:"uid"`
			} `json:"datasource"`
		} `json:"targets"`
		Links []struct {
			Title string `json:"title"`
			URL   string `json:"url"`
		} `json:"links"`
	} `json:"panels"`
	Links []struct {
		URL string `json:"url"`
	} `json:"links"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func readDashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	b, err := os.ReadFile("grafana/otelpgxtx.json")
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// grafanaVars are what the test puts in place of Grafana's variables: the demo's job, a
// rate window of a minute (Prometheus scrapes every second here), the last 5 minutes as
// the dashboard's range.
var grafanaVars = strings.NewReplacer(`$job`, `otelpgxtx-demo`, `$__rate_interval`, `1m`, `$__range`, `5m`)

// alertLink is an alert link's URL: the rule's name after search=.
var alertLink = regexp.MustCompile(`^\$\{prometheus_ui\}/alerts\?search=([A-Za-z]+)$`)

// TestDashboard runs every query of the shipped Grafana dashboard against a real
// Prometheus scraping the demo after one round of its scenarios and a short load (every
// outcome, an indeterminate commit reconciled, the connection pool in use): each must be
// valid PromQL and return at least one series, and each result is logged. Every alert
// link of a panel names a rule Prometheus loaded from alerts.yml, and every rule is
// linked from some panel.
func TestDashboard(t *testing.T) {
	ctx := pgtest.Context(t, 4*time.Minute)
	d := readDashboard(t)
	a, p, out, errOut := scrapedDemo(t, ctx, "otelpgxtx-dashboard")
	// A scrape before the work, with every counter's series at its start (0): rate() and
	// increase() need two samples of a series.
	waitFor(t, ctx, time.Minute, "a scrape of the demo before its round", func() bool {
		return len(p.query(t, ctx, `otelpgxtx_participations_total{job="otelpgxtx-demo"}`)) > 0
	})

	if rep := a.round(ctx, 1); !rep.ok() {
		a.report(rep)
		t.Fatalf("the demo's scenarios failed:\n%s\n%s", out.String(), errOut.String())
	}
	// The histograms have no series before their first measurement (a histogram has no
	// meaningful 0): a scrape with them all, before the load, so that the load's scrape
	// is their second sample.
	waitFor(t, ctx, time.Minute, "a scrape with every histogram", func() bool {
		for _, h := range []string{"otelpgxtx_reconciliation_duration_seconds", "otelpgxtx_transaction_duration_seconds", "otelpgxtx_transaction_commit_duration_seconds",
			"db_client_connection_create_time_seconds", "db_client_connection_wait_time_seconds", "db_client_connection_use_time_seconds"} {
			if len(p.query(t, ctx, h+`_count{job="otelpgxtx-demo"}`)) == 0 {
				return false
			}
		}
		return true
	})
	// Pool exhaustion: the demo's pool is held whole, an acquire's deadline passes.
	var held []*pgxpool.Conn
	for range a.pool.Config().MaxConns {
		c, err := a.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if _, err := a.pool.Acquire(tctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire from the exhausted pool: %v, want its deadline", err)
	}
	cancel()
	for _, c := range held {
		c.Release()
	}
	if rep := a.runLoad(ctx, 400, 4); len(rep.errs) > 0 {
		t.Fatalf("load: %v", rep.errs)
	}
	// Wait for a scrape that saw all of it: Prometheus's count of finished transactions
	// equals the exporter's, and the reconciliation of the indeterminate commits is in.
	want := gathered(t, a, "otelpgxtx_transaction_duration_seconds")
	waitFor(t, ctx, time.Minute, fmt.Sprintf("Prometheus counting the %v transactions of the round and the load", want), func() bool {
		r := p.query(t, ctx, `sum(otelpgxtx_transaction_duration_seconds_count{job="otelpgxtx-demo"})`)
		u := p.query(t, ctx, `sum(otelpgxtx_reconciliation_unresolved)`)
		return len(r) == 1 && r[0].Value[1] == fmt.Sprint(want) && len(u) == 1 && u[0].Value[1] == "0"
	})

	checkPoolMetrics(t, ctx, p, a)

	queries := 0
	for _, panel := range d.Panels {
		for _, target := range panel.Targets {
			queries++
			if target.Datasource.Type != "prometheus" || target.Datasource.UID != "${datasource}" {
				t.Errorf("%s %s: data source %+v, want the dashboard's Prometheus variable", panel.Title, target.RefID, target.Datasource)
			}
			expr := grafanaVars.Replace(target.Expr)
			var res struct {
				Result []promSample `json:"result"`
			}
			if err := p.api(ctx, "/api/v1/query", map[string][]string{"query": {expr}}, &res); err != nil {
				t.Errorf("%s %s: %v", panel.Title, target.RefID, err)
				continue
			}
			if len(res.Result) == 0 {
				t.Errorf("%s %s: no series for %s", panel.Title, target.RefID, expr)
			}
			t.Logf("%s %s: %s", panel.Title, target.RefID, samples(res.Result))
		}
	}
	if queries < 20 {
		t.Errorf("%d queries in the dashboard, want its 20 or more", queries)
	}

	// The alert links: each names a loaded rule, every rule is linked.
	loaded := map[string]bool{}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Name string `json:"name"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := p.api(ctx, "/api/v1/rules", nil, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			loaded[r.Name] = true
		}
	}
	linked := map[string]bool{}
	for _, panel := range d.Panels {
		for _, l := range panel.Links {
			m := alertLink.FindStringSubmatch(l.URL)
			if m == nil || !loaded[m[1]] || l.Title != "Alert "+m[1] {
				t.Errorf("%s: link %q %q is not to a rule of alerts.yml that Prometheus loaded (%v)", panel.Title, l.Title, l.URL, keys(loaded))
				continue
			}
			linked[m[1]] = true
		}
	}
	for _, name := range alertNames {
		if !loaded[name] || !linked[name] {
			t.Errorf("rule %s: loaded %v, linked from a panel %v", name, loaded[name], linked[name])
		}
	}
}

// checkPoolMetrics reads the connection-pool metrics as Prometheus scraped them from the
// demo, logs them, and checks them against the pool: its configuration, its
// pgxpool.Stat, the one timeout TestDashboard made.
func checkPoolMetrics(t *testing.T, ctx context.Context, p *promProc, a *app) {
	t.Helper()
	cfg := a.pool.Config()
	// The pool at rest: a scrape that saw its counts as pgxpool.Stat has them now.
	var stat *pgxpool.Stat
	waitFor(t, ctx, time.Minute, "Prometheus's connection counts at pgxpool.Stat's", func() bool {
		stat = a.pool.Stat()
		idle := p.query(t, ctx, `db_client_connection_count{db_client_connection_state="idle"}`)
		used := p.query(t, ctx, `db_client_connection_count{db_client_connection_state="used"}`)
		return len(idle) == 1 && len(used) == 1 && idle[0].Value[1] == fmt.Sprint(stat.IdleConns()) && used[0].Value[1] == fmt.Sprint(stat.AcquiredConns())
	})
	var names []string
	if err := p.api(ctx, "/api/v1/label/__name__/values", map[string][]string{"match[]": {`{__name__=~"db_client_connection_.*"}`}}, &names); err != nil {
		t.Fatal(err)
	}
	wantNames := []string{"db_client_connection_count", "db_client_connection_idle_max", "db_client_connection_idle_min",
		"db_client_connection_max", "db_client_connection_pending_requests", "db_client_connection_timeouts_total"}
	for _, h := range []string{"create_time", "use_time", "wait_time"} {
		for _, s := range []string{"_bucket", "_count", "_sum"} {
			wantNames = append(wantNames, "db_client_connection_"+h+"_seconds"+s)
		}
	}
	sort.Strings(wantNames)
	if !slices.Equal(names, wantNames) {
		t.Errorf("Prometheus holds %v, want the semantic conventions' %v", names, wantNames)
	}
	value := func(q string) string {
		r := p.query(t, ctx, q)
		t.Logf("pool: %s = %s", q, samples(r))
		for _, s := range r {
			// The pool's name and its database identity (semantic-conventions PR #4097).
			for _, l := range []string{"db_client_connection_pool_name", "db_namespace", "server_address", "server_port"} {
				if s.Metric[l] == "" {
					t.Errorf("%s: series %v without %s", q, s.Metric, l)
				}
			}
			if s.Metric["db_system_name"] != "postgresql" {
				t.Errorf("%s: series %v: db_system_name is not postgresql", q, s.Metric)
			}
		}
		if len(r) != 1 {
			return fmt.Sprint(len(r), " series")
		}
		return fmt.Sprint(r[0].Value[1])
	}
	for q, want := range map[string]string{
		`db_client_connection_max`:                                              fmt.Sprint(cfg.MaxConns),
		`db_client_connection_idle_max`:                                         fmt.Sprint(cfg.MaxConns),
		`db_client_connection_idle_min`:                                         fmt.Sprint(cfg.MinIdleConns),
		`db_client_connection_pending_requests`:                                 "0",
		`db_client_connection_timeouts_total`:                                   "1",
		`sum without (db_client_connection_state) (db_client_connection_count)`: fmt.Sprint(stat.IdleConns() + stat.AcquiredConns()),
		`db_client_connection_count{db_client_connection_state="used"}`:         "0",
		`db_client_connection_create_time_seconds_count`:                        fmt.Sprint(stat.NewConnsCount()),
	} {
		if got := value(q); got != want {
			t.Errorf("%s = %s, want %s", q, got, want)
		}
	}
	for _, h := range []string{"db_client_connection_wait_time_seconds_count", "db_client_connection_use_time_seconds_count"} {
		if got := value(h); got == "0" || strings.Contains(got, "series") {
			t.Errorf("%s = %s, want the demo's acquires", h, got)
		}
	}
}

// gathered is the sum of the demo exporter's samples of a counter family, or the count of
// a histogram family's.
func gathered(t *testing.T, a *app, name string) float64 {
	t.Helper()
	mfs, err := a.registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// samples renders a query's result: each series' labels (the job and instance left out)
// and value, sorted.
func samples(r []promSample) string {
	var out []string
	for _, s := range r {
		var labels []string
		for k, v := range s.Metric {
			if k != "job" && k != "instance" && !strings.HasPrefix(k, "otel_scope") {
				labels = append(labels, k+"="+v)
			}
		}
		sort.Strings(labels)
		out = append(out, fmt.Sprintf("{%s} %v", strings.Join(labels, ","), s.Value[1]))
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// TestDashboardProvisioned: docker-compose.yml's Grafana mounts the dashboard and the
// provisioning this directory ships, whose data source is the compose file's Prometheus,
// under the uid-less variable the dashboard's queries use; every variable a link or a
// query uses is defined.
func TestDashboardProvisioned(t *testing.T) {
	d := readDashboard(t)
	compose := readCompose(t)
	g, ok := compose.Services["grafana"]
	if !ok {
		t.Fatal("docker-compose.yml has no grafana service")
	}
	mounts := map[string]string{}
	for _, v := range g.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 {
			t.Fatalf("volume %q", v)
		}
		mounts[parts[1]] = parts[0]
		if _, err := os.Stat(filepath.Join("../..", parts[0])); err != nil {
			t.Errorf("grafana mounts %s, which is not in the repository: %v", parts[0], err)
		}
	}
	var provider struct {
		Providers []struct {
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	readYAML(t, "grafana/provisioning/dashboards/otelpgxtx.yml", &provider)
	if len(provider.Providers) != 1 || mounts[provider.Providers[0].Options.Path+"/otelpgxtx.json"] != "./examples/jaeger/grafana/otelpgxtx.json" ||
		mounts["/etc/grafana/provisioning"] != "./examples/jaeger/grafana/provisioning" {
		t.Errorf("grafana mounts %v; the dashboard provider reads %+v", mounts, provider)
	}
	var ds struct {
		Datasources []struct {
			Type      string `yaml:"type"`
			URL       string `yaml:"url"`
			IsDefault bool   `yaml:"isDefault"`
		} `yaml:"datasources"`
	}
	readYAML(t, "grafana/provisioning/datasources/prometheus.yml", &ds)
	if _, ok := compose.Services["prometheus"]; !ok || len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" ||
		ds.Datasources[0].URL != "http://prometheus:9090" || !ds.Datasources[0].IsDefault {
		t.Errorf("provisioned data sources %+v, want the compose file's prometheus as the default", ds)
	}
	defined := map[string]bool{}
	for _, v := range d.Templating.List {
		defined[v.Name] = true
	}
	varRe := regexp.MustCompile(`\$\{?([a-z_]+)`)
	var uses []string
	for _, l := range d.Links {
		uses = append(uses, l.URL)
	}
	for _, p := range d.Panels {
		for _, l := range p.Links {
			uses = append(uses, l.URL)
		}
		for _, q := range p.Targets {
			uses = append(uses, q.Expr, q.Datasource.UID)
		}
	}
	for _, u := range uses {
		for _, m := range varRe.FindAllStringSubmatch(u, -1) {
			if !defined[m[1]] && !strings.HasPrefix(m[1], "__") {
				t.Errorf("%q uses $%s, which the dashboard does not define (%v)", u, m[1], keys(defined))
			}
		}
	}
	if d.UID != "otelpgxtx" || !slices.ContainsFunc(d.Templating.List, func(v struct {
		Name  string `json:"name"`
		Type  string `json:"type"`
		Query any    `json:"query"`
	}) bool {
		return v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
	}) {
		t.Errorf("dashboard uid %q, variables %+v", d.UID, d.Templating.List)
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}
