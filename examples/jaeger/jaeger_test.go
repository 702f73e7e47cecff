package main

// The Jaeger v2 process the end-to-end test runs, and its query APIs.

import (
	"context"
	"encoding/json"
	"errors"
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

	"go.opentelemetry.io/otel/codes"

	"github.com/txevidence/otelpgxtx/pgtest"
)

// ---- Jaeger ----------------------------------------------------------------------

type jaegerProc struct {
	otlpHTTP, otlpGRPC, query string // host:port, all on 127.0.0.1
	client                    *http.Client
}

// jaegerBinary returns the binary scripts/jaeger builds and caches (or $OTELPGXTX_JAEGER).
func jaegerBinary(t *testing.T) string {
	t.Helper()
	return toolPath(t, "OTELPGXTX_JAEGER", "scripts/jaeger", "jaeger-"+jaegerModuleVersion, "jaeger")
}

// startJaeger runs Jaeger v2 with in-memory storage, the OTLP receivers and the query
// service, every listener on 127.0.0.1 and a free port, and waits until it is healthy.
func startJaeger(t *testing.T) *jaegerProc {
	t.Helper()
	bin := jaegerBinary(t)
	if out, err := exec.Command(bin, "version").Output(); err == nil {
		t.Logf("jaeger %s: %s", bin, bytesTrim(out))
	}
	j, health, queryGRPC := newJaegerProc(t)
	dir := t.TempDir()
	conf := fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query, healthcheckv2]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    traces:
      level: none # else Jaeger's own spans go to localhost:4317
    logs:
      level: info
extensions:
  healthcheckv2:
    use_v2: true
    http:
      endpoint: %s
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: %s
    grpc:
      endpoint: %s
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
      http:
        endpoint: %s
processors:
  batch:
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`, health, j.query, queryGRPC, j.otlpGRPC, j.otlpHTTP)
	confPath := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	j.start(t, bin, dir, health, "file:"+confPath)
	return j
}

// newJaegerProc picks free ports for a Jaeger's OTLP receivers and query API; health
// and queryGRPC are the other two listeners every configuration has.
func newJaegerProc(t *testing.T) (j *jaegerProc, health, queryGRPC string) {
	ports := freePorts(t, 5)
	j = &jaegerProc{
		otlpGRPC: ports[0], otlpHTTP: ports[1], query: ports[2],
		client: &http.Client{Timeout: 10 * time.Second},
	}
	return j, ports[3], ports[4]
}

// start runs bin with the configuration at conf (in dir, with env added to the
// environment) until the test ends, and waits until its health check at health answers.
func (j *jaegerProc) start(t *testing.T, bin, dir, health, conf string, env ...string) {
	t.Helper()
	cmd := exec.Command(bin, "--config", conf)
	cmd.Env = append(os.Environ(), env...)
	// After queries through the HTTP API, Jaeger v2.13 takes about 10 seconds to shut
	// down; its storage is in memory, so there is nothing to wait for.
	runTool(t, "jaeger", dir, cmd, j.client, "http://"+health+"/status")
	t.Logf("jaeger: OTLP gRPC %s, OTLP HTTP %s, query %s", j.otlpGRPC, j.otlpHTTP, j.query)
}

func bytesTrim(b []byte) string { return strings.TrimSpace(string(b)) }

// freePorts reserves n ports for the processes a test starts (see pgtest.ReservePort:
// a port the kernel picks may be taken by any outgoing connection before they bind it).
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		p, err := pgtest.ReservePort()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Release() })
		out = append(out, p.Addr())
	}
	return out
}

func (j *jaegerProc) get(ctx context.Context, path string, q url.Values) (int, []byte, error) {
	return httpGet(ctx, j.client, j.query, path, q)
}

// waitForTrace polls the v3 API until the trace holds n spans: ingestion is
// asynchronous (batching on both sides), so the condition is the trace itself.
func (j *jaegerProc) waitForTrace(t *testing.T, ctx context.Context, traceID string, n int) *jTrace {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for {
		code, body, err := j.get(ctx, "/api/v3/traces/"+traceID, nil)
		switch {
		case err != nil:
			last = err.Error()
		case code == http.StatusOK:
			jt, err := parseV3(body)
			if err != nil {
				t.Fatalf("trace %s: %v\n%s", traceID, err, body)
			}
			if len(jt.spans) >= n {
				return jt
			}
			last = fmt.Sprintf("%d of %d spans", len(jt.spans), n)
		default:
			last = fmt.Sprintf("HTTP %d %s", code, bytesTrim(body))
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s not complete in Jaeger after 30s: %s", traceID, last)
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// findTracesV3 returns the ids of the service's traces since from, through the v3 API.
func (j *jaegerProc) findTracesV3(t *testing.T, ctx context.Context, service string, from time.Time) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	for id := range j.spansByTrace(t, ctx, service, from, 1000) {
		ids[id] = true
	}
	return ids
}

// spansByTrace returns the number of spans of each of the service's traces since from
// (at most limit traces), through the v3 API.
func (j *jaegerProc) spansByTrace(t *testing.T, ctx context.Context, service string, from time.Time, limit int) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, s := range j.findSpans(t, ctx, service, from, limit).spans {
		n[s.traceID]++
	}
	return n
}

// findSpans returns every span of the traces that have a span of the service since from
// (at most limit traces), through the v3 API.
func (j *jaegerProc) findSpans(t *testing.T, ctx context.Context, service string, from time.Time, limit int) *jTrace {
	t.Helper()
	q := url.Values{
		"query.service_name":   {service},
		"query.start_time_min": {from.UTC().Format(time.RFC3339Nano)},
		"query.start_time_max": {time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano)},
		"query.num_traces":     {strconv.Itoa(limit)},
	}
	code, body, err := j.get(ctx, "/api/v3/traces", q)
	if err == nil && code == http.StatusNotFound {
		return &jTrace{byID: map[string]*jSpan{}} // the v3 API's answer to an empty result
	}
	if err != nil || code != http.StatusOK {
		t.Fatalf("v3 find traces: %d %v %s", code, err, body)
	}
	jt, err := parseV3(body)
	if err != nil {
		t.Fatal(err)
	}
	return jt
}

// searchByTag searches as the UI does (the HTTP JSON API behind "Tags"), and returns the
// traces found and the spans in them that carry the tag.
func (j *jaegerProc) searchByTag(t *testing.T, ctx context.Context, service, key, value string, from time.Time) (traces, spans map[string]bool) {
	t.Helper()
	tags, _ := json.Marshal(map[string]string{key: value})
	q := url.Values{
		"service": {service},
		"tags":    {string(tags)},
		"start":   {strconv.FormatInt(from.UnixMicro(), 10)},
		"end":     {strconv.FormatInt(time.Now().Add(time.Minute).UnixMicro(), 10)},
		"limit":   {"1000"},
	}
	code, body, err := j.get(ctx, "/api/traces", q)
	if err != nil || code != http.StatusOK {
		t.Fatalf("search %s=%s: %d %v %s", key, value, code, err, body)
	}
	var resp struct {
		Data []struct {
			TraceID string `json:"traceID"`
			Spans   []struct {
				SpanID string `json:"spanID"`
				Tags   []struct {
					Key   string `json:"key"`
					Value any    `json:"value"`
				} `json:"tags"`
			} `json:"spans"`
		} `json:"data"`
		Errors []any `json:"errors"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatalf("search: %v\n%s", err, body)
	}
	if len(resp.Errors) > 0 {
		t.Fatalf("search: errors %v", resp.Errors)
	}
	traces, spans = map[string]bool{}, map[string]bool{}
	for _, tr := range resp.Data {
		traces[tr.TraceID] = true
		for _, s := range tr.Spans {
			for _, tag := range s.Tags {
				if tag.Key == key && fmt.Sprint(tag.Value) == value {
					spans[s.SpanID] = true
				}
			}
		}
	}
	return traces, spans
}

// ---- the v3 API's OTLP JSON, flattened --------------------------------------------

const (
	kindInternal = 1 // OTLP SPAN_KIND_INTERNAL
	kindClient   = 3 // OTLP SPAN_KIND_CLIENT

	statusUnset = 0
	statusOk    = 1
	statusError = 2
)

func statusCode(c codes.Code) int {
	switch c {
	case codes.Ok:
		return statusOk
	case codes.Error:
		return statusError
	}
	return statusUnset
}

type jSpan struct {
	traceID, spanID, parent string
	name, scope             string
	service                 string // the resource's service.name
	kind                    int
	start, end              int64
	attrs                   map[string]string
	events                  []jEvent // in time order
	links                   []string
	status                  int
	statusMsg               string
}

type jEvent struct {
	name  string
	time  int64
	attrs map[string]string
}

func (s *jSpan) isFrame() bool {
	if s.isImplicit() {
		return true
	}
	_, ok := s.attrs["tx.frame.depth"]
	return ok && s.scope == "github.com/txevidence/otelpgxtx"
}

// isImplicit reports an implicit transaction's frame: its statement's span (otelpgx's).
func (s *jSpan) isImplicit() bool { return s.attrs["tx.implicit"] == "true" }

// isPrepare reports an otelpgx prepare span (pgx prepares a statement on its first
// use on a connection).
func (s *jSpan) isPrepare() bool {
	_, ok := s.attrs["pgx.prepare_stmt.name"]
	return ok
}

func (s *jSpan) eventNames() []string {
	out := make([]string, len(s.events))
	for i, e := range s.events {
		out[i] = e.name
	}
	return out
}

type jTrace struct {
	spans []*jSpan
	byID  map[string]*jSpan
}

func (jt *jTrace) frames() []*jSpan {
	var out []*jSpan
	for _, s := range jt.spans {
		if s.isFrame() {
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b *jSpan) int { return compareInt(a.start, b.start) })
	return out
}

func (jt *jTrace) roots() []*jSpan {
	var out []*jSpan
	for _, s := range jt.spans {
		if jt.byID[s.parent] == nil {
			out = append(out, s)
		}
	}
	return out
}

func (jt *jTrace) children(p *jSpan) []*jSpan {
	var out []*jSpan
	for _, s := range jt.spans {
		if s.parent == p.spanID {
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b *jSpan) int { return compareInt(a.start, b.start) })
	return out
}

func compareInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

type v3KV struct {
	Key   string  `json:"key"`
	Value v3Value `json:"value"`
}

type v3Value struct {
	StringValue *string  `json:"stringValue"`
	IntValue    any      `json:"intValue"` // int64 comes as a JSON string
	BoolValue   *bool    `json:"boolValue"`
	DoubleValue *float64 `json:"doubleValue"`
	ArrayValue  *struct {
		Values []v3Value `json:"values"`
	} `json:"arrayValue"`
}

func (v v3Value) String() string {
	switch {
	case v.StringValue != nil:
		return *v.StringValue
	case v.IntValue != nil:
		return fmt.Sprint(v.IntValue)
	case v.BoolValue != nil:
		return strconv.FormatBool(*v.BoolValue)
	case v.DoubleValue != nil:
		return strconv.FormatFloat(*v.DoubleValue, 'g', -1, 64)
	case v.ArrayValue != nil:
		parts := make([]string, len(v.ArrayValue.Values))
		for i, e := range v.ArrayValue.Values {
			parts[i] = e.String()
		}
		return strings.Join(parts, "\x00")
	}
	return ""
}

func attrMap(kvs []v3KV) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.String()
	}
	return m
}

// enumInt reads an OTLP enum that may come as a number or as its name.
func enumInt(v any, names map[string]int) int {
	switch v := v.(type) {
	case float64:
		return int(v)
	case string:
		return names[v]
	}
	return 0
}

func nanos(v string) int64 {
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

func parseV3(body []byte) (*jTrace, error) {
	var resp struct {
		Result struct {
			ResourceSpans []struct {
				Resource struct {
					Attributes []v3KV `json:"attributes"`
				} `json:"resource"`
				ScopeSpans []struct {
					Scope struct {
						Name string `json:"name"`
					} `json:"scope"`
					Spans []struct {
						TraceID           string `json:"traceId"`
						SpanID            string `json:"spanId"`
						ParentSpanID      string `json:"parentSpanId"`
						Name              string `json:"name"`
						Kind              any    `json:"kind"`
						StartTimeUnixNano string `json:"startTimeUnixNano"`
						EndTimeUnixNano   string `json:"endTimeUnixNano"`
						Attributes        []v3KV `json:"attributes"`
						Events            []struct {
							TimeUnixNano string `json:"timeUnixNano"`
							Name         string `json:"name"`
							Attributes   []v3KV `json:"attributes"`
						} `json:"events"`
						Links []struct {
							SpanID string `json:"spanId"`
						} `json:"links"`
						Status struct {
							Code    any    `json:"code"`
							Message string `json:"message"`
						} `json:"status"`
					} `json:"spans"`
				} `json:"scopeSpans"`
			} `json:"resourceSpans"`
		} `json:"result"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, err
	}
	jt := &jTrace{byID: map[string]*jSpan{}}
	kinds := map[string]int{"SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3, "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}
	statuses := map[string]int{"STATUS_CODE_OK": statusOk, "STATUS_CODE_ERROR": statusError}
	for _, rs := range resp.Result.ResourceSpans {
		service := attrMap(rs.Resource.Attributes)["service.name"]
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				js := &jSpan{
					traceID: s.TraceID, spanID: s.SpanID, parent: s.ParentSpanID, name: s.Name, scope: ss.Scope.Name, service: service,
					kind:  enumInt(s.Kind, kinds),
					start: nanos(s.StartTimeUnixNano), end: nanos(s.EndTimeUnixNano),
					attrs:  attrMap(s.Attributes),
					status: enumInt(s.Status.Code, statuses), statusMsg: s.Status.Message,
				}
				for _, e := range s.Events {
					js.events = append(js.events, jEvent{name: e.Name, time: nanos(e.TimeUnixNano), attrs: attrMap(e.Attributes)})
				}
				// The v3 API returns events sorted by name: put them back in time order.
				slices.SortStableFunc(js.events, func(a, b jEvent) int { return compareInt(a.time, b.time) })
				for _, l := range s.Links {
					js.links = append(js.links, l.SpanID)
				}
				if js.spanID == "" {
					return nil, errors.New("a span without spanId")
				}
				jt.spans = append(jt.spans, js)
				jt.byID[js.spanID] = js
			}
		}
	}
	return jt, nil
}

func spanNames(ss []*jSpan) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.name
	}
	return out
}

func mapsEqual(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
