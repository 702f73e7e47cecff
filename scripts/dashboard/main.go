// Command dashboard writes the Grafana dashboard of what an operator of otelpgxtx watches
// — transaction outcomes, indeterminate commits and their reconciliation, commit
// latency, the connection pool — built with grafana-foundation-sdk, to
// examples/jaeger/grafana/otelpgxtx.json, which docker-compose.yml provisions:
//
//	cd scripts/dashboard && go run .
//
// It is a module of its own, so that the library's go.mod does not depend on the SDK.
// Its test fails when the committed JSON is not what this program writes; the demo's
// end-to-end test (examples/jaeger, TestDashboard) runs every panel's query against a
// real Prometheus.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// out is where the dashboard goes, relative to this directory.
const out = "../../examples/jaeger/grafana/otelpgxtx.json"

func main() {
	path := flag.String("o", out, "file to write the dashboard JSON to")
	flag.Parse()
	b, err := render()
	if err == nil {
		err = os.WriteFile(*path, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}

// query is one PromQL target of a panel and the legend of its series.
type query struct{ expr, legend string }

// panel is one panel: a time series unless single is set (a stat of the current value).
type panel struct {
	title, description string
	unit               string
	single             bool
	stacked            bool
	queries            []query
	// alerts are the rules of examples/jaeger/alerts.yml the panel is about: each is a
	// link to it in Prometheus's alerts page.
	alerts []string
	width  uint32
}

// row is a titled row of panels.
type row struct {
	title  string
	panels []panel
}

// sel is the label selector every query carries: the job chosen at the top.
const sel = `job=~"$job"`

// poolBy are the labels the pool panels group by: the pool's name, and its server, which
// keeps apart pools of two servers whose databases share a name (the default name).
var poolBy = []string{"db_client_connection_pool_name", "server_address"}

// quantiles are a latency panel's queries: p50, p90 and p99 of a histogram, by the labels.
func quantiles(histogram string, by ...string) []query {
	var qs []query
	for _, q := range []struct{ q, name string }{{"0.5", "p50"}, {"0.9", "p90"}, {"0.99", "p99"}} {
		legend := q.name
		for _, l := range by {
			legend += " {{" + l + "}}"
		}
		qs = append(qs, query{
			expr:   fmt.Sprintf(`histogram_quantile(%s, sum by (%s) (rate(%s_bucket{%s}[$__rate_interval])))`, q.q, strings.Join(append([]string{"le"}, by...), ", "), histogram, sel),
			legend: legend,
		})
	}
	return qs
}

// rows are the dashboard, top to bottom.
var rows = []row{
	{"Transactions", []panel{
		{title: "Transactions by outcome", width: 12, stacked: true, unit: "ops",
			description: "Physical transactions (frames) ending per second, by tx.outcome (the count of the duration histogram, one data point per frame); rolled_back split by tx.rollback: deliberate (the application's own Rollback(), not an error) or failure; implicit ones (autocommit writes: tx.implicit) apart from BEGIN … COMMIT.",
			queries:     []query{{`sum by (tx_outcome, tx_rollback, tx_implicit) (rate(otelpgxtx_transaction_duration_seconds_count{` + sel + `}[$__rate_interval]))`, "{{tx_outcome}} {{tx_rollback}} implicit={{tx_implicit}}"}},
			alerts:      []string{"TransactionRollbackRateHigh", "TransactionPostCommitFailure"}},
		{title: "Failed rollbacks, share of transactions", width: 6, unit: "percentunit",
			description: "Transactions rolled back because something failed, of all that ended, over 5 minutes: what TransactionRollbackRateHigh pages on above 20 %. Deliberate rollbacks are not counted.",
			queries:     []query{{`sum by (job, instance) (rate(otelpgxtx_transaction_duration_seconds_count{tx_outcome="rolled_back", tx_rollback="failure", ` + sel + `}[5m])) / sum by (job, instance) (rate(otelpgxtx_transaction_duration_seconds_count{` + sel + `}[5m]))`, "{{instance}}"}},
			alerts:      []string{"TransactionRollbackRateHigh"}},
		{title: "Run calls that joined a transaction", width: 6, stacked: true, unit: "ops",
			description: "Run calls that joined a transaction already in their context (participants commit nothing), by tx.participant.outcome and tx.propagation.",
			queries:     []query{{`sum by (tx_participant_outcome, tx_propagation) (rate(otelpgxtx_participations_total{` + sel + `}[$__rate_interval]))`, "{{tx_participant_outcome}} {{tx_propagation}}"}}},
	}},
	{"Indeterminate commits and reconciliation", []panel{
		{title: "Indeterminate commits", width: 6, single: true, unit: "short",
			description: "Commits whose outcome the client could not observe — a COMMIT's, or an autocommit write's (tx.implicit) —, in the time range: a series that appeared in the range (a process's first one makes it, at 1) counts from its start, the others by increase(), which extrapolates over the range (rounded). Never replay one: reconciliation settles it.",
			queries:     []query{{`round(sum((otelpgxtx_transaction_duration_seconds_count{tx_outcome="indeterminate", ` + sel + `} unless otelpgxtx_transaction_duration_seconds_count{tx_outcome="indeterminate", ` + sel + `} offset $__range) or increase(otelpgxtx_transaction_duration_seconds_count{tx_outcome="indeterminate", ` + sel + `}[$__range])))`, "indeterminate"}},
			alerts:      []string{"TransactionCommitIndeterminate", "TransactionIndeterminateRateHigh"}},
		{title: "Still unresolved", width: 6, single: true, unit: "short",
			description: "Indeterminate commits automatic reconciliation has not settled yet.",
			queries:     []query{{`sum(otelpgxtx_reconciliation_unresolved{` + sel + `})`, "unresolved"}},
			alerts:      []string{"TransactionCommitUnresolved"}},
		{title: "Oldest unresolved", width: 6, single: true, unit: "s",
			description: "Age of the oldest indeterminate commit still waiting for an answer; TransactionCommitUnresolved pages above 5 minutes.",
			queries:     []query{{`max(otelpgxtx_reconciliation_unresolved_age_seconds{` + sel + `})`, "age"}},
			alerts:      []string{"TransactionCommitUnresolved"}},
		{title: "Reconciliation results by reason", width: 6, single: true, unit: "short",
			description: "Final answers of automatic reconciliation in the time range, by tx.outcome.resolved and, for unknown, the reason (error.type).",
			queries:     []query{{`round(sum by (tx_outcome_resolved, error_type) (increase(otelpgxtx_reconciliations_total{` + sel + `}[$__range])))`, "{{tx_outcome_resolved}} {{error_type}}"}},
			alerts:      []string{"TransactionReconciledUnknown", "TransactionCommitAborted"}},
		{title: "Time to reconcile", width: 24, unit: "s",
			description: "From an indeterminate commit to its reconciliation's final answer.",
			queries:     quantiles("otelpgxtx_reconciliation_duration_seconds")},
	}},
	{"Latency", []panel{
		{title: "Commit latency", width: 12, unit: "s",
			description: "Time frames spent committing (COMMIT sent to its outcome), all outcomes.",
			queries:     quantiles("otelpgxtx_transaction_commit_duration_seconds")},
		{title: "Transaction duration p99 by outcome", width: 12, unit: "s",
			description: "BEGIN to outcome, by tx.outcome.",
			queries:     []query{{`histogram_quantile(0.99, sum by (le, tx_outcome) (rate(otelpgxtx_transaction_duration_seconds_bucket{` + sel + `}[$__rate_interval])))`, "p99 {{tx_outcome}}"}}},
	}},
	{"Connection pool (db.client.connection.*)", []panel{
		{title: "Connections by state", width: 8, stacked: true, unit: "short",
			description: "Connections idle and used (acquired), and the most the pool opens, by db.client.connection.pool.name and server.address.",
			queries: []query{
				{`sum by (db_client_connection_pool_name, server_address, db_client_connection_state) (db_client_connection_count{` + sel + `})`, "{{db_client_connection_state}} {{db_client_connection_pool_name}} {{server_address}}"},
				{`sum by (db_client_connection_pool_name, server_address) (db_client_connection_max{` + sel + `})`, "max {{db_client_connection_pool_name}} {{server_address}}"},
			}},
		{title: "Pending acquires and timeouts", width: 8, unit: "short",
			description: "Acquires waiting for a connection now, and acquires per second whose deadline passed first: pool exhaustion, which makes indeterminate commits read differently from a failover.",
			queries: []query{
				{`sum by (db_client_connection_pool_name, server_address) (db_client_connection_pending_requests{` + sel + `})`, "pending {{db_client_connection_pool_name}} {{server_address}}"},
				{`sum by (db_client_connection_pool_name, server_address) (rate(db_client_connection_timeouts_total{` + sel + `}[$__rate_interval]))`, "timeouts/s {{db_client_connection_pool_name}} {{server_address}}"},
			}},
		{title: "Connection create time", width: 8, unit: "s",
			description: "Time new connections took to connect.",
			queries:     quantiles("db_client_connection_create_time_seconds")},
		{title: "Pool wait time", width: 12, unit: "s",
			description: "Time acquires waited for a connection.",
			queries:     quantiles("db_client_connection_wait_time_seconds", poolBy...)},
		{title: "Connection use time", width: 12, unit: "s",
			description: "Time from an acquire to the connection's release.",
			queries:     quantiles("db_client_connection_use_time_seconds", poolBy...)},
	}},
}

// datasource is the Prometheus data source every panel queries: the one chosen at the top.
var datasource = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

// render builds the dashboard and returns its JSON.
func render() ([]byte, error) {
	//lint:ignore SA1019 the v1 schema on purpose: Grafana's file provisioning and examples/jaeger's TestDashboard read it; dashboardv2 writes another format.
	b := dashboard.NewDashboardBuilder("otelpgxtx: transactions, reconciliation, connection pool").
		Uid("otelpgxtx").
		Description("What an operator of an application instrumented with otelpgxtx watches. Panel links lead to the alert rules of examples/jaeger/alerts.yml in Prometheus.").
		Tags([]string{"otelpgxtx", "postgresql"}).
		Refresh("30s").
		Time("now-1h", "now").
		Timezone(common.TimeZoneBrowser).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Prometheus").Type("prometheus")).
		WithVariable(dashboard.NewQueryVariableBuilder("job").Label("Job").
			Query(dashboard.StringOrMap{String: cog.ToPtr("label_values(otelpgxtx_transaction_duration_seconds_count, job)")}).
			Datasource(datasource).Multi(true).IncludeAll(true).AllValue(".*").
			Current(dashboard.VariableOption{Text: option("All"), Value: option("$__all")}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged)).
		WithVariable(textBox("prometheus_ui", "Prometheus UI", "http://localhost:9090")).
		WithVariable(textBox("jaeger_ui", "Jaeger UI", "http://localhost:16686")).
		Link(dashboard.NewDashboardLinkBuilder("Alert rules (alerts.yml)").Type(dashboard.DashboardLinkTypeLink).
			Url("${prometheus_ui}/alerts").TargetBlank(true)).
		Link(dashboard.NewDashboardLinkBuilder("Indeterminate frames in Jaeger").Type(dashboard.DashboardLinkTypeLink).
			Url(`${jaeger_ui}/search?tags=%7B%22tx.outcome%22%3A%22indeterminate%22%7D`).TargetBlank(true))
	var y, id uint32
	for _, r := range rows {
		id++
		b = b.WithRow(dashboard.NewRowBuilder(r.title).Id(id).GridPos(dashboard.GridPos{X: 0, Y: y, W: 24, H: 1}))
		y++
		var x, rowH uint32
		for _, p := range r.panels {
			if x+p.width > 24 {
				x, y = 0, y+rowH
			}
			h := uint32(8)
			if p.single {
				h = 5
			}
			id++
			b = b.WithPanel(build(p, id, dashboard.GridPos{X: x, Y: y, W: p.width, H: h}))
			x, rowH = x+p.width, h
		}
		y += rowH
	}
	d, err := b.Build()
	if err != nil {
		return nil, err
	}
	j, err := json.MarshalIndent(d, "", "  ")
	return append(j, '\n'), err
}

// textBox is a variable the user types, with its default value: where a UI is.
func textBox(name, label, value string) cog.Builder[dashboard.VariableModel] {
	v := option(value)
	return dashboard.NewTextBoxVariableBuilder(name).Label(label).
		DefaultValue(dashboard.StringOrMap{String: cog.ToPtr(value)}).
		Current(dashboard.VariableOption{Text: v, Value: v})
}

// option is a variable option's text or value.
func option(s string) dashboard.StringOrArrayOfString {
	return dashboard.StringOrArrayOfString{String: cog.ToPtr(s)}
}

// build makes panel id.
func build(p panel, id uint32, pos dashboard.GridPos) cog.Builder[dashboard.Panel] {
	var targets []cog.Builder[variants.Dataquery]
	for i, q := range p.queries {
		targets = append(targets, prometheus.NewDataqueryBuilder().
			RefId(string(rune('A'+i))).Expr(q.expr).LegendFormat(q.legend).Datasource(datasource))
	}
	var links []cog.Builder[dashboard.DashboardLink]
	for _, a := range p.alerts {
		links = append(links, dashboard.NewDashboardLinkBuilder("Alert "+a).Type(dashboard.DashboardLinkTypeLink).
			Url("${prometheus_ui}/alerts?search="+a).TargetBlank(true))
	}
	if p.single {
		return stat.NewPanelBuilder().Id(id).Title(p.title).Description(p.description).Unit(p.unit).
			Datasource(datasource).GridPos(pos).Targets(targets).Links(links).
			ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
			GraphMode(common.BigValueGraphModeNone)
	}
	ts := timeseries.NewPanelBuilder().Id(id).Title(p.title).Description(p.description).Unit(p.unit).
		Datasource(datasource).GridPos(pos).Targets(targets).Links(links)
	if p.stacked {
		ts = ts.Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)).FillOpacity(30)
	}
	return ts
}
