package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// telemetry is the SDK side: traces to OTLP (when something listens) and always to an
// in-memory collector, for the terminal trees and the demo's own checks; metrics to a
// Prometheus registry, served on /metrics when asked.
type telemetry struct {
	tp        *sdktrace.TracerProvider
	mp        *sdkmetric.MeterProvider
	collector *collector
	registry  *prometheus.Registry
	otlp      string // where traces are exported: "" when nowhere
	server    *http.Server
	serveErr  chan error
}

func newTelemetry(ctx context.Context, cfg config, out io.Writer) (*telemetry, error) {
	t := &telemetry{collector: &collector{}, registry: prometheus.NewRegistry()}
	res := resource.NewSchemaless(
		attribute.String("service.name", cfg.serviceName),
		attribute.String("service.version", "demo"),
	)
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithSpanProcessor(t.collector),
	}
	endpoint, protocol, reachable, note := chooseOTLP(ctx, cfg)
	fmt.Fprintln(out, "OTLP:", note)
	if reachable {
		exp, err := newSpanExporter(ctx, endpoint, protocol)
		if err != nil {
			return nil, err
		}
		// Blocking rather than dropping when the queue is full (the load generator fills
		// it), and a short batch delay, so that a trace's spans reach a tail-sampling
		// collector well within its decision wait.
		opts = append(opts, sdktrace.WithBatcher(exp, sdktrace.WithBlocking(), sdktrace.WithBatchTimeout(time.Second)))
		t.otlp = fmt.Sprintf("%s (%s)", endpoint, protocol)
	}
	t.tp = sdktrace.NewTracerProvider(opts...)

	exp, err := otelprom.New(otelprom.WithRegisterer(t.registry))
	if err != nil {
		return nil, errors.Join(err, t.tp.Shutdown(ctx))
	}
	t.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res))

	if cfg.metricsAddr != "" {
		l, err := net.Listen("tcp", cfg.metricsAddr)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("metrics: %w", err), t.shutdown(ctx))
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{}))
		t.server = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		t.serveErr = make(chan error, 1)
		go func() { t.serveErr <- t.server.Serve(l) }()
		fmt.Fprintf(out, "Metrics: Prometheus exposition at %s\n", metricsURL(l.Addr().String()))
	}
	return t, nil
}

func (t *telemetry) shutdown(ctx context.Context) error {
	var errs []error
	if t.server != nil {
		errs = append(errs, t.server.Shutdown(ctx))
		if err := <-t.serveErr; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	if t.tp != nil {
		errs = append(errs, t.tp.Shutdown(ctx))
	}
	if t.mp != nil {
		errs = append(errs, t.mp.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// chooseOTLP decides where traces go. An explicit endpoint is waited for (bounded by
// cfg.otlpWait: in docker compose the collector may start after the demo); without one,
// the two default endpoints get one short dial each. Nothing reachable means the traces
// are printed as trees instead.
func chooseOTLP(ctx context.Context, cfg config) (endpoint, protocol string, reachable bool, note string) {
	if cfg.otlpEndpoint != "" {
		endpoint, protocol = normalizeEndpoint(cfg.otlpEndpoint), cfg.otlpProtocol
		addr, err := dialAddress(endpoint, protocol)
		if err != nil {
			return endpoint, protocol, false, fmt.Sprintf("bad endpoint %q: %v; traces are printed instead", cfg.otlpEndpoint, err)
		}
		if err := waitReachable(ctx, addr, cfg.otlpWait); err != nil {
			return endpoint, protocol, false, fmt.Sprintf("%s (%s) not reachable: %v; traces are printed instead", endpoint, protocol, err)
		}
		return endpoint, protocol, true, fmt.Sprintf("exporting traces to %s (%s)", endpoint, protocol)
	}
	for _, c := range []struct{ endpoint, protocol string }{
		{"http://localhost:4318", protoHTTP},
		{"http://localhost:4317", protoGRPC},
	} {
		addr, _ := dialAddress(c.endpoint, c.protocol)
		if waitReachable(ctx, addr, 0) == nil {
			return c.endpoint, c.protocol, true, fmt.Sprintf("exporting traces to %s (%s)", c.endpoint, c.protocol)
		}
	}
	return "", "", false, "nothing listens on localhost:4318 or localhost:4317; traces are printed as trees below"
}

// normalizeEndpoint gives a scheme to host:port endpoints, as the OTLP exporters read them.
func normalizeEndpoint(e string) string {
	e = strings.TrimRight(e, "/")
	if !strings.Contains(e, "://") {
		return "http://" + e
	}
	return e
}

func dialAddress(endpoint, protocol string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", err
	}
	if u.Host == "" {
		return "", errors.New("no host")
	}
	if u.Port() != "" {
		return u.Host, nil
	}
	port := "4318"
	switch {
	case protocol == protoGRPC:
		port = "4317"
	case u.Scheme == "https":
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// waitReachable dials addr until it accepts a connection or wait has passed (one short
// dial when wait is 0).
func waitReachable(ctx context.Context, addr string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	var d net.Dialer
	for {
		dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		c, err := d.DialContext(dctx, "tcp", addr)
		cancel()
		if err == nil {
			return c.Close()
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func newSpanExporter(ctx context.Context, endpoint, protocol string) (sdktrace.SpanExporter, error) {
	if protocol == protoGRPC {
		return otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(endpoint))
	}
	// OTEL_EXPORTER_OTLP_ENDPOINT is a base URL: the signal's path is appended to it.
	return otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(endpoint+"/v1/traces"))
}

// metricsURL is where a browser on this machine finds the metrics served at addr.
func metricsURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/metrics"
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port) + "/metrics"
}
