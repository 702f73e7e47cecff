package main

import (
	"fmt"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// report prints a round: the trees (when nothing else receives the traces, or when
// asked), one line per scenario, where to look, and the outcome metrics.
func (a *app) report(rep roundReport) {
	w := a.out
	printTrees := a.cfg.tree == treeAlways || (a.cfg.tree == treeAuto && a.tel.otlp == "")
	if printTrees && (a.cfg.repeat == 0 || rep.n == 1) {
		fmt.Fprintln(w)
		for _, s := range rep.scenarios {
			renderTrace(w, s.sc.name+": "+s.sc.title, s.spans)
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintf(w, "Round %d:\n", rep.n)
	if rep.err != nil {
		fmt.Fprintf(w, "  FAILED to run: %v\n", rep.err)
	}
	var indeterminate []string
	for _, s := range rep.scenarios {
		mark := "ok  "
		if s.err != nil {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %-22s %s\n", mark, s.sc.name, strings.Join(s.results, " "))
		if s.err != nil {
			fmt.Fprintf(w, "       %v\n", s.err)
		}
		if slices.Contains(s.sc.frames, "indeterminate") {
			indeterminate = append(indeterminate, s.traceID.String())
		}
	}
	if rep.n == 1 || !rep.ok() {
		a.whereToLook(rep, indeterminate)
	}
	if lines := metricSummary(a.registry()); len(lines) > 0 && (a.cfg.repeat == 0 || rep.n == 1) {
		fmt.Fprintln(w, "Metrics (Prometheus names, as the OpenTelemetry Prometheus exporter writes them):")
		for _, l := range lines {
			fmt.Fprintln(w, "  "+l)
		}
	}
	switch {
	case rep.interrupted:
		fmt.Fprintf(w, "Round %d was interrupted.\n", rep.n)
	case rep.ok():
		fmt.Fprintf(w, "Every scenario produced its expected outcome (round %d).\n", rep.n)
	default:
		fmt.Fprintf(w, "Some scenarios did NOT produce their expected outcome (round %d).\n", rep.n)
	}
}

func (a *app) whereToLook(rep roundReport, indeterminate []string) {
	w := a.out
	ui := strings.TrimRight(a.cfg.jaegerUI, "/")
	fmt.Fprintln(w, "Where to look:")
	if a.tel.otlp == "" {
		fmt.Fprintln(w, "  The traces above went nowhere but this terminal: no OTLP endpoint answered.")
		fmt.Fprintln(w, "  With Jaeger (`docker compose up` at the repository root, or any Jaeger v2 all-in-one")
		fmt.Fprintf(w, "  receiving OTLP on localhost:4318), run again and open %s\n", ui)
	} else {
		fmt.Fprintf(w, "  Traces were exported to %s.\n", a.tel.otlp)
		fmt.Fprintf(w, "  Jaeger UI: %s  (Service %q)\n", ui, a.cfg.serviceName)
	}
	fmt.Fprintln(w, "  Search by Tags: tx.outcome=indeterminate   (also: committed, rolled_back, committed_with_post_commit_failure)")
	if a.tel.otlp != "" {
		for _, id := range indeterminate {
			fmt.Fprintf(w, "  The indeterminate commit of this round: %s/trace/%s\n", ui, id)
		}
	}
	if a.cfg.metricsAddr != "" {
		fmt.Fprintf(w, "  Metrics: %s; with docker compose, Prometheus alerts at http://localhost:9090/alerts\n", metricsURL(a.cfg.metricsAddr))
	}
	for _, sc := range rep.scenarios {
		if slices.Contains(sc.results, "reconciled=committed") {
			fmt.Fprintln(w, "  Alerts (alerts.yml): the indeterminate commit was reconciled committed in the background,")
			fmt.Fprintln(w, "  so it pages nobody; TransactionCommitUnresolved pages if one stays unknown for 5 minutes,")
			fmt.Fprintln(w, "  TransactionCommitAborted if one did not commit after all.")
		}
	}
}

// metricSummary renders the library's metrics from the registry — its own and the
// connection pool's (db.client.connection.*) —: the counters and gauges by their labels,
// and the histograms' sample counts.
func metricSummary(reg interface {
	Gather() ([]*dto.MetricFamily, error)
}) []string {
	mfs, err := reg.Gather()
	if err != nil {
		return []string{"(gathering metrics: " + err.Error() + ")"}
	}
	var lines []string
	for _, mf := range mfs {
		name := mf.GetName()
		if !strings.HasPrefix(name, "otelpgxtx_") && !strings.HasPrefix(name, "db_client_connection_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				if n := l.GetName(); n != "db_system_name" && !strings.HasPrefix(n, "otel_scope_") {
					labels = append(labels, fmt.Sprintf("%s=%q", n, l.GetValue()))
				}
			}
			series := name
			if len(labels) > 0 {
				series += "{" + strings.Join(labels, ",") + "}"
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				// The reconciliation series of reasons that did not happen are left out.
				if v := m.GetCounter().GetValue(); v > 0 || name != "otelpgxtx_reconciliations_total" {
					lines = append(lines, fmt.Sprintf("%s %g", series, v))
				}
			case dto.MetricType_GAUGE:
				lines = append(lines, fmt.Sprintf("%s %g", series, m.GetGauge().GetValue()))
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				lines = append(lines, fmt.Sprintf("%s_count%s %d  (sum %.3fs)", name, series[len(name):], h.GetSampleCount(), h.GetSampleSum()))
			}
		}
	}
	return lines
}
