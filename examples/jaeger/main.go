// Command jaeger is the otelpgxtx demo: it produces every transaction outcome for real,
// through the library, against a real PostgreSQL, and shows the traces.
//
//	go run .                      # throw-away PostgreSQL; traces printed as trees if no OTLP endpoint answers
//	docker compose up             # from the repository root: PostgreSQL, Jaeger, Prometheus and this demo
//
// Environment (each also a flag; see -help):
//
//	DATABASE_URL                  use this server instead of a throw-away one; it must have
//	                              synchronous_standby_names set (see docker-compose.yml)
//	OTEL_EXPORTER_OTLP_ENDPOINT   OTLP endpoint (default: http://localhost:4318, then localhost:4317)
//	OTEL_EXPORTER_OTLP_PROTOCOL   http/protobuf (default) or grpc
//	OTEL_SERVICE_NAME             service name of the traces (default otelpgxtx-demo)
//	METRICS_ADDR                  serve Prometheus metrics on this address, e.g. :9464
//	DEMO_REPEAT                   run the scenarios again every interval (e.g. 30s) until stopped
//	DEMO_LOAD                     instead of the scenarios, run this many transactions in the
//	                              load generator's mix of outcomes (for tail-sampling.yaml)
//	DEMO_LOAD_VIA                 send the load's transactions as requests to the front
//	                              service at this URL instead (no database needed)
//	DEMO_SERVE                    instead of the scenarios, be the database service: serve
//	                              POST /orders?kind=K&index=I on this address (e.g. :8081)
//	DEMO_FRONT, DEMO_BACKEND      instead, be the front service: serve the same API on
//	                              DEMO_FRONT and pass each request to the database service
//	                              at DEMO_BACKEND (no database needed)
//	DEMO_TREE                     auto (default: print trees when nothing receives OTLP), always, never
//	JAEGER_UI_URL                 where to tell the reader to look (default http://localhost:16686)
//	DEMO_SPANS                    BEGIN, COMMIT, ROLLBACK, savepoints and implicit prepares as
//	                              events (default, the library's) or as spans of their own
//
// It is a check as well as a demo: it exits 0 only when every scenario produced the
// outcome it was built to produce, and the frame spans say so.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Exit codes.
const (
	exitOK       = 0
	exitMismatch = 1 // a scenario did not produce its expected outcome
	exitSetup    = 2 // the demo could not run (no PostgreSQL, bad configuration, …)
)

func main() {
	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(exitOK)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(exitSetup)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, cfg, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// config is what the environment and the flags asked for.
type config struct {
	databaseURL  string
	otlpEndpoint string        // explicit endpoint URL; "" probes the defaults
	otlpProtocol string        // protoHTTP or protoGRPC
	otlpWait     time.Duration // how long to wait for an explicit endpoint to accept connections
	serviceName  string
	metricsAddr  string
	repeat       time.Duration
	load         int    // transactions of the load generator; 0 runs the scenarios
	loadVia      string // the front service's URL the load is sent to; "" runs it here
	serveAddr    string // be the database service, on this address
	frontAddr    string // be the front service, on this address
	backendURL   string // the database service the front service calls
	tree         string // treeAuto, treeAlways, treeNever
	spans        string // spansEvents, spansStatements
	jaegerUI     string
	// scenarioTimeout bounds each scenario: every wait in it is on an observable
	// condition, and this is the bound on all of them.
	scenarioTimeout time.Duration
}

const (
	protoHTTP = "http/protobuf"
	protoGRPC = "grpc"

	treeAuto   = "auto"
	treeAlways = "always"
	treeNever  = "never"

	// spansEvents: the library's default, transaction-control statements and implicit
	// prepares as events; spansStatements: as spans of their own (WithInnerSpans).
	spansEvents     = "events"
	spansStatements = "spans"
)

// parseConfig reads the configuration from the flags in args, most of which default to an
// environment variable (read with getenv), and checks it; usage and flag errors go to
// errOut.
func parseConfig(args []string, getenv func(string) string, errOut io.Writer) (config, error) {
	env := &envDefaults{getenv: getenv}
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(errOut)
	var cfg config
	defineFlags(fs, &cfg, env)
	if err := errors.Join(env.errs...); err != nil {
		return cfg, err
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := checkValues(cfg); err != nil {
		return cfg, err
	}
	if err := checkModes(cfg); err != nil {
		return cfg, err
	}
	cfg.backendURL, cfg.loadVia = strings.TrimRight(cfg.backendURL, "/"), strings.TrimRight(cfg.loadVia, "/")
	return cfg, nil
}

// envDefaults reads the flags' defaults from the environment. It keeps the error of every
// value it cannot parse, so that parseConfig reports them all, not only the first.
type envDefaults struct {
	getenv func(string) string
	errs   []error
}

// str returns the variable k, or def when it is empty or unset.
func (e *envDefaults) str(k, def string) string {
	if v := e.getenv(k); v != "" {
		return v
	}
	return def
}

// duration returns the variable k parsed as a duration, or def when it is empty or unset.
func (e *envDefaults) duration(k string, def time.Duration) time.Duration {
	v := e.getenv(k)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("$%s: %w", k, err))
	}
	return d
}

// integer returns the variable k parsed as an integer, or 0 when it is empty or unset.
func (e *envDefaults) integer(k string) int {
	v := e.getenv(k)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("$%s: %w", k, err))
	}
	return n
}

// defineFlags defines on fs a flag for every field of cfg, most with their default from
// env, so that each setting can come from the environment (as docker compose gives it) or
// from the command line, which wins.
func defineFlags(fs *flag.FlagSet, cfg *config, env *envDefaults) {
	fs.StringVar(&cfg.databaseURL, "database-url", env.str("DATABASE_URL", ""), "PostgreSQL URL ($DATABASE_URL); empty starts a throw-away server")
	fs.StringVar(&cfg.otlpEndpoint, "otlp-endpoint", env.str("OTEL_EXPORTER_OTLP_ENDPOINT", ""), "OTLP endpoint URL ($OTEL_EXPORTER_OTLP_ENDPOINT); empty tries http://localhost:4318, then localhost:4317")
	fs.StringVar(&cfg.otlpProtocol, "otlp-protocol", env.str("OTEL_EXPORTER_OTLP_PROTOCOL", protoHTTP), "OTLP protocol ($OTEL_EXPORTER_OTLP_PROTOCOL): http/protobuf or grpc")
	fs.DurationVar(&cfg.otlpWait, "otlp-wait", env.duration("DEMO_OTLP_WAIT", 10*time.Second), "how long to wait for an explicit OTLP endpoint to accept connections ($DEMO_OTLP_WAIT)")
	fs.StringVar(&cfg.serviceName, "service-name", env.str("OTEL_SERVICE_NAME", "otelpgxtx-demo"), "service.name of the traces ($OTEL_SERVICE_NAME)")
	fs.StringVar(&cfg.metricsAddr, "metrics-addr", env.str("METRICS_ADDR", ""), "serve Prometheus metrics at this address under /metrics, e.g. :9464 ($METRICS_ADDR)")
	fs.DurationVar(&cfg.repeat, "repeat", env.duration("DEMO_REPEAT", 0), "run the scenarios again every interval until stopped; 0 runs them once ($DEMO_REPEAT)")
	fs.IntVar(&cfg.load, "load", env.integer("DEMO_LOAD"), "run this many transactions of every outcome instead of the scenarios ($DEMO_LOAD)")
	fs.StringVar(&cfg.loadVia, "load-via", env.str("DEMO_LOAD_VIA", ""), "send the load's transactions to the front service at this URL ($DEMO_LOAD_VIA)")
	fs.StringVar(&cfg.serveAddr, "serve", env.str("DEMO_SERVE", ""), "be the database service: serve POST /orders on this address ($DEMO_SERVE)")
	fs.StringVar(&cfg.frontAddr, "front", env.str("DEMO_FRONT", ""), "be the front service: serve POST /orders on this address, calling -backend ($DEMO_FRONT)")
	fs.StringVar(&cfg.backendURL, "backend", env.str("DEMO_BACKEND", ""), "the database service the front service calls, e.g. http://localhost:8081 ($DEMO_BACKEND)")
	fs.StringVar(&cfg.tree, "tree", env.str("DEMO_TREE", treeAuto), "print the traces as trees: auto (when nothing receives OTLP), always, never ($DEMO_TREE)")
	fs.StringVar(&cfg.spans, "spans", env.str("DEMO_SPANS", spansEvents), "BEGIN, COMMIT, ROLLBACK, savepoints and implicit prepares as events of their frame or statement (events, the library's default) or as spans of their own (spans) ($DEMO_SPANS)")
	fs.StringVar(&cfg.jaegerUI, "jaeger-ui", env.str("JAEGER_UI_URL", "http://localhost:16686"), "Jaeger UI address to point at ($JAEGER_UI_URL)")
	fs.DurationVar(&cfg.scenarioTimeout, "scenario-timeout", 60*time.Second, "bound on each scenario")
}

// checkValues fails on a setting outside the values the program knows, or on a negative
// duration or load, so that a mistyped setting stops the demo before it starts instead of
// changing what it does.
func checkValues(cfg config) error {
	if cfg.spans != spansEvents && cfg.spans != spansStatements {
		return fmt.Errorf("spans %q: want %s or %s", cfg.spans, spansEvents, spansStatements)
	}
	switch cfg.otlpProtocol {
	case protoHTTP, protoGRPC:
	default:
		return fmt.Errorf("OTLP protocol %q: want %s or %s", cfg.otlpProtocol, protoHTTP, protoGRPC)
	}
	switch cfg.tree {
	case treeAuto, treeAlways, treeNever:
	default:
		return fmt.Errorf("tree %q: want auto, always or never", cfg.tree)
	}
	if cfg.repeat < 0 || cfg.scenarioTimeout <= 0 || cfg.otlpWait < 0 {
		return errors.New("durations must not be negative")
	}
	if cfg.load < 0 {
		return errors.New("load must not be negative")
	}
	return nil
}

// checkModes fails unless the settings ask for at most one of the programs the demo can
// be (the load generator, the database service, the front service), each with what it
// needs: run picks one by the first setting it sees, and would ignore the others.
func checkModes(cfg config) error {
	modes := 0
	for _, on := range []bool{cfg.load > 0, cfg.serveAddr != "", cfg.frontAddr != ""} {
		if on {
			modes++
		}
	}
	switch {
	case modes > 1:
		return errors.New("load, serve and front are different programs: give one")
	case (cfg.frontAddr != "") != (cfg.backendURL != ""):
		return errors.New("the front service needs a backend, and only it has one")
	case cfg.loadVia != "" && cfg.load == 0:
		return errors.New("load-via needs a load")
	}
	return nil
}

// run runs the demo and returns the exit code.
func run(ctx context.Context, cfg config, out, errOut io.Writer) int {
	switch {
	case cfg.frontAddr != "":
		return runFront(ctx, cfg, out, errOut)
	case cfg.loadVia != "":
		return runLoadVia(ctx, cfg, out, errOut)
	}
	a, err := newApp(ctx, cfg, out, errOut)
	if err != nil {
		fmt.Fprintln(errOut, "demo:", err)
		return exitSetup
	}
	if cfg.load > 0 {
		return runLoadOnly(ctx, a, cfg.load, out, errOut)
	}
	if cfg.serveAddr != "" {
		return serveUntilDone(ctx, "database service", cfg.serveAddr, a.ordersHandler(), out, errOut, a.close)
	}
	failed := false
	for n := 1; ; n++ {
		rep := a.round(ctx, n)
		if err := a.flush(ctx); err != nil {
			fmt.Fprintln(errOut, "demo: flushing telemetry:", err)
			failed = true
		}
		a.report(rep)
		failed = failed || !rep.ok()
		if cfg.repeat == 0 || ctx.Err() != nil {
			break
		}
		t := time.NewTimer(cfg.repeat)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		if ctx.Err() != nil {
			break
		}
	}
	if err := a.close(context.WithoutCancel(ctx)); err != nil {
		fmt.Fprintln(errOut, "demo: shutting down:", err)
		failed = true
	}
	if failed {
		return exitMismatch
	}
	return exitOK
}

// runLoadOnly runs the load generator once and returns the exit code.
func runLoadOnly(ctx context.Context, a *app, n int, out, errOut io.Writer) int {
	rep := a.runLoad(ctx, n, 4)
	printLoad(out, rep)
	code := exitOK
	if len(rep.errs) > 0 || ctx.Err() != nil {
		code = exitMismatch
	}
	if err := a.close(context.WithoutCancel(ctx)); err != nil {
		fmt.Fprintln(errOut, "demo: shutting down:", err)
		code = exitMismatch
	}
	return code
}

// runLoadVia runs the load generator through the front service: no database here.
func runLoadVia(ctx context.Context, cfg config, out, errOut io.Writer) int {
	// In docker compose the two services may still be starting: the front is ready when
	// the database service is.
	if err := waitHealthy(ctx, cfg.loadVia, time.Minute); err != nil {
		fmt.Fprintf(errOut, "demo: the front service at %s: %v\n", cfg.loadVia, err)
		return exitSetup
	}
	rep := runLoadWith(ctx, 0, cfg.load, 4, httpLoad(cfg.loadVia, cfg.scenarioTimeout))
	printLoad(out, rep)
	if len(rep.errs) > 0 || ctx.Err() != nil {
		return exitMismatch
	}
	return exitOK
}

// runFront is the front service: no database, only telemetry and the backend.
func runFront(ctx context.Context, cfg config, out, errOut io.Writer) int {
	tel, err := newTelemetry(ctx, cfg, out)
	if err != nil {
		fmt.Fprintln(errOut, "demo:", err)
		return exitSetup
	}
	return serveUntilDone(ctx, "front service", cfg.frontAddr, frontHandler(tel, cfg.backendURL, cfg.scenarioTimeout), out, errOut, tel.shutdown)
}

// serveUntilDone serves h on addr until ctx ends (a signal), then calls closer.
func serveUntilDone(ctx context.Context, name, addr string, h http.Handler, out, errOut io.Writer, closer func(context.Context) error) int {
	code := exitOK
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(errOut, "demo: %s: %v\n", name, err)
		code = exitSetup
	} else {
		fmt.Fprintf(out, "%s: POST http://%s%s?kind=…&index=… until stopped\n", name, l.Addr(), ordersPath)
		if err := serveHTTP(ctx, l, h); err != nil {
			fmt.Fprintf(errOut, "demo: %s: %v\n", name, err)
			code = exitMismatch
		}
	}
	if err := closer(context.WithoutCancel(ctx)); err != nil {
		fmt.Fprintln(errOut, "demo: shutting down:", err)
		code = exitMismatch
	}
	return code
}
