package main

// The two-service demo: the database service (-serve) runs the load generator's
// transactions behind an HTTP API, and the front service (-front), another process, takes
// the same requests and calls it. Both are instrumented with otelhttp and propagate W3C
// trace context, so one request is one trace whose spans leave from two processes — in
// the two-tier pipeline, through different first-tier collectors.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

const (
	// ordersPath is the API of both services: POST /orders?kind=K&index=I runs the load
	// generator's transaction I (load.go), built to end as kind K.
	ordersPath = "/orders"
	healthPath = "/healthz"
)

// orderReply is the answer to POST /orders.
type orderReply struct {
	Outcome string `json:"outcome,omitempty"` // the frame's tx.outcome, as built
	TraceID string `json:"trace_id,omitempty"`
	Error   string `json:"error,omitempty"`
}

// ordersHandler is the database service: each request runs one transaction of the load
// generator's mix on the instrumented pool, under the request's server span.
func (a *app) ordersHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+ordersPath, func(w http.ResponseWriter, r *http.Request) {
		i, k, err := parseOrder(r.URL.Query())
		if err != nil {
			writeReply(w, r, http.StatusBadRequest, orderReply{Error: err.Error()})
			return
		}
		trace.SpanFromContext(r.Context()).SetAttributes(
			attribute.String("load.kind", k.String()), attribute.Int("load.index", i))
		if err := a.loadOne(r.Context(), k, loadRowID(i)); err != nil {
			writeReply(w, r, http.StatusInternalServerError, orderReply{Error: err.Error()})
			return
		}
		writeReply(w, r, http.StatusOK, orderReply{Outcome: k.outcome().String()})
	})
	return instrumentHTTP(mux, a.tel, func(context.Context) error { return nil })
}

// frontHandler is the front service: it passes each order to the database service at
// backend, in the same trace.
func frontHandler(tel *telemetry, backend string, timeout time.Duration) http.Handler {
	client := &http.Client{
		Transport: otelhttp.NewTransport(newTransport(),
			otelhttp.WithTracerProvider(tel.tp), otelhttp.WithPropagators(propagation.TraceContext{})),
		Timeout: timeout,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+ordersPath, func(w http.ResponseWriter, r *http.Request) {
		if _, _, err := parseOrder(r.URL.Query()); err != nil {
			writeReply(w, r, http.StatusBadRequest, orderReply{Error: err.Error()})
			return
		}
		reply, code, err := postOrder(r.Context(), client, backend, r.URL.RawQuery)
		switch {
		case err != nil:
			writeReply(w, r, http.StatusBadGateway, orderReply{Error: "database service: " + err.Error()})
		case reply.TraceID != traceIDOf(r.Context()):
			// The trace context did not cross: the two halves would be two traces.
			writeReply(w, r, http.StatusInternalServerError, orderReply{Error: fmt.Sprintf(
				"the database service answered in trace %s, the front's is %s", reply.TraceID, traceIDOf(r.Context()))})
		default:
			writeReply(w, r, code, reply)
		}
	})
	// Ready when the database service is: an order taken before would fail.
	health := &http.Client{Transport: newTransport(), Timeout: 5 * time.Second}
	return instrumentHTTP(mux, tel, func(ctx context.Context) error { return checkHealth(ctx, health, backend) })
}

// instrumentHTTP adds a health check, which answers 200 when ready says so, and makes
// every other request a server span that continues the caller's trace.
func instrumentHTTP(mux *http.ServeMux, tel *telemetry, ready func(context.Context) error) http.Handler {
	mux.HandleFunc("GET "+healthPath, func(w http.ResponseWriter, r *http.Request) {
		if err := ready(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	return otelhttp.NewHandler(mux, "orders",
		otelhttp.WithTracerProvider(tel.tp),
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithFilter(func(r *http.Request) bool { return r.URL.Path != healthPath }),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method + " " + r.URL.Path }))
}

func parseOrder(q url.Values) (int, loadKind, error) {
	i, err := strconv.Atoi(q.Get("index"))
	if err != nil || i < 0 {
		return 0, 0, fmt.Errorf("index %q: want a whole number from 0", q.Get("index"))
	}
	for k := range numLoadKinds {
		if k.String() == q.Get("kind") {
			return i, k, nil
		}
	}
	return 0, 0, fmt.Errorf("kind %q: want one of %v", q.Get("kind"), loadKindNames)
}

func orderQuery(i int, k loadKind) string {
	return url.Values{"kind": {k.String()}, "index": {strconv.Itoa(i)}}.Encode()
}

func traceIDOf(ctx context.Context) string {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc.TraceID().String()
	}
	return ""
}

// writeReply answers with reply as JSON, naming the request's trace.
func writeReply(w http.ResponseWriter, r *http.Request, code int, reply orderReply) {
	if reply.TraceID == "" {
		reply.TraceID = traceIDOf(r.Context())
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(reply)
}

// postOrder sends POST /orders?query to the service at base and reads its reply.
func postOrder(ctx context.Context, client *http.Client, base, query string) (orderReply, int, error) {
	var reply orderReply
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+ordersPath+"?"+query, nil)
	if err != nil {
		return reply, 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply, resp.StatusCode, err
	}
	if err := json.Unmarshal(b, &reply); err != nil {
		return reply, resp.StatusCode, fmt.Errorf("HTTP %d: %q: %w", resp.StatusCode, b, err)
	}
	return reply, resp.StatusCode, nil
}

// checkHealth asks the service at base whether it is ready.
func checkHealth(ctx context.Context, client *http.Client, base string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+healthPath, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d %s", base+healthPath, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return nil
}

// waitHealthy polls the service at base until it is ready, for at most wait.
func waitHealthy(ctx context.Context, base string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	client := &http.Client{Timeout: 5 * time.Second}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		err := checkHealth(ctx, client, base)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready within %v: %w", wait, err)
		case <-tick.C:
		}
	}
}

// newTransport keeps a connection per load worker, instead of opening one per request.
func newTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return t
}

// httpLoad runs the load generator's transactions as requests to the service at base:
// each is a trace the service begins, which the reply names.
func httpLoad(base string, timeout time.Duration) loadFunc {
	client := &http.Client{Transport: newTransport(), Timeout: timeout}
	return func(ctx context.Context, i int, k loadKind) (trace.TraceID, error) {
		reply, code, err := postOrder(ctx, client, base, orderQuery(i, k))
		id, idErr := trace.TraceIDFromHex(reply.TraceID)
		switch {
		case err != nil:
			return id, err
		case code != http.StatusOK:
			return id, fmt.Errorf("HTTP %d: %s", code, reply.Error)
		case idErr != nil:
			return id, fmt.Errorf("the reply names no trace: %w", idErr)
		case reply.Outcome != k.outcome().String():
			return id, fmt.Errorf("outcome %q, want %q", reply.Outcome, k.outcome())
		}
		return id, nil
	}
}

// serveHTTP serves h on l until ctx ends, then shuts down, letting requests in flight
// finish for up to 10 seconds.
func serveHTTP(ctx context.Context, l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
