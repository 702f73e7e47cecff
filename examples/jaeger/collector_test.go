package main

// The OpenTelemetry Collector the two-tier pipeline runs (scripts/collector builds it from
// scripts/otelcol), one process per collector, and its own metrics.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"
)

// collectorBinary returns the binary scripts/collector builds and caches (or
// $OTELPGXTX_OTELCOL). Its cache entry is named by the same digest of scripts/otelcol.
func collectorBinary(t *testing.T) string {
	t.Helper()
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join("../../scripts/otelcol", f))
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	return toolPath(t, "OTELPGXTX_OTELCOL", "scripts/collector", "otelcol-"+hex.EncodeToString(h.Sum(nil))[:12], "otelcol")
}

// collectorProc is one collector running a configuration of examples/jaeger, every
// listener on 127.0.0.1 and a port of its own, which it keeps across restarts.
type collectorProc struct {
	name, bin, conf, dir string
	env                  []string
	otlpGRPC, otlpHTTP   string
	health, telemetry    string
	client               *http.Client
	proc                 *toolProc
}

// startCollector runs bin with the configuration file conf (of this directory) and env
// added to the environment, and waits until it is healthy.
func startCollector(t *testing.T, bin, name, conf string, env ...string) *collectorProc {
	t.Helper()
	abs, err := filepath.Abs(conf)
	if err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, 4)
	c := &collectorProc{
		name: name, bin: bin, conf: abs, dir: t.TempDir(), env: env,
		otlpGRPC: ports[0], otlpHTTP: ports[1], health: ports[2], telemetry: ports[3],
		client: &http.Client{Timeout: 10 * time.Second},
	}
	c.start(t)
	return c
}

func (c *collectorProc) start(t *testing.T) {
	t.Helper()
	host, port := splitHostPort(t, c.telemetry)
	cmd := exec.Command(c.bin, "--config", "file:"+c.conf)
	cmd.Env = append(append(os.Environ(),
		"OTLP_GRPC_ENDPOINT="+c.otlpGRPC, "OTLP_HTTP_ENDPOINT="+c.otlpHTTP, "HEALTH_ENDPOINT="+c.health,
		"TELEMETRY_HOST="+host, "TELEMETRY_PORT="+port), c.env...)
	c.proc = runTool(t, c.name, c.dir, cmd, c.client, "http://"+c.health+"/")
}

// metrics reads the collector's own metrics: the value of each series by metric name,
// summed over the series whose labels include every one of match (name=value).
func (c *collectorProc) metrics(t *testing.T, ctx context.Context, match ...string) map[string]float64 {
	t.Helper()
	code, body, err := httpGet(ctx, c.client, c.telemetry, "/metrics", nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("%s metrics: %d %v", c.name, code, err)
	}
	return sumSeries(t, body, match...)
}

// metric is one metric of the collector (see metrics).
func (c *collectorProc) metric(t *testing.T, ctx context.Context, name string, match ...string) float64 {
	t.Helper()
	return c.metrics(t, ctx, match...)[name]
}

func sumSeries(t *testing.T, exposition []byte, match ...string) map[string]float64 {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(exposition))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if !hasLabels(m, match) {
				continue
			}
			switch {
			case m.Counter != nil:
				out[name] += m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[name] += m.GetGauge().GetValue()
			case m.Untyped != nil:
				out[name] += m.GetUntyped().GetValue()
			}
		}
	}
	return out
}

func hasLabels(m *dto.Metric, match []string) bool {
	have := map[string]bool{}
	for _, l := range m.GetLabel() {
		have[l.GetName()+"="+l.GetValue()] = true
	}
	for _, kv := range match {
		if !have[kv] {
			return false
		}
	}
	return true
}

// TestSamplerPoliciesMatch: the samplers of the two-tier pipeline decide as the single
// collector does, so the policies of collector-sampler.yaml are those of
// tail-sampling.yaml, to the letter.
func TestSamplerPoliciesMatch(t *testing.T) {
	policies := func(file string) any {
		var conf struct {
			Processors struct {
				TailSampling struct {
					Policies any `yaml:"policies"`
				} `yaml:"tail_sampling"`
			} `yaml:"processors"`
		}
		readYAML(t, file, &conf)
		if conf.Processors.TailSampling.Policies == nil {
			t.Fatalf("%s has no tail_sampling policies", file)
		}
		return conf.Processors.TailSampling.Policies
	}
	if single, sampler := policies("tail-sampling.yaml"), policies("collector-sampler.yaml"); !reflect.DeepEqual(single, sampler) {
		t.Errorf("the policies differ:\ntail-sampling.yaml:     %v\ncollector-sampler.yaml: %v", single, sampler)
	}
}

// TestComposeTwoTier: the compose profile two-tier runs the tested pipeline. Its
// collectors run collector-sampler.yaml and collector-tier1.yaml in otelcol-contrib at
// the release scripts/otelcol builds; the first tier lists exactly the profile's
// samplers, the samplers send to its Jaeger, each service sends to a first-tier
// collector of its own, the front calls the database service and the load the front.
func TestComposeTwoTier(t *testing.T) {
	services := readCompose(t).Services
	mod, err := os.ReadFile("../../scripts/otelcol/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`tailsamplingprocessor v(\S+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("scripts/otelcol/go.mod requires no tailsamplingprocessor")
	}
	image := "otel/opentelemetry-collector-contrib:" + string(m[1])
	// host:port → the service it names, or "".
	hostOf := func(what, addr string) string {
		if u, err := url.Parse(addr); err == nil && u.Host != "" {
			addr = u.Host
		}
		host, _, err := net.SplitHostPort(addr)
		if err != nil || len(services[host].Profiles) == 0 {
			t.Errorf("%s %q names no service of the profile", what, addr)
			return ""
		}
		return host
	}
	byConf := map[string][]string{}
	for name, s := range services {
		if !slices.Contains(s.Profiles, "two-tier") {
			continue
		}
		for _, conf := range []string{"collector-sampler.yaml", "collector-tier1.yaml"} {
			if slices.Contains(s.Command, "file:/etc/otelcol/"+conf) {
				byConf[conf] = append(byConf[conf], name)
				if s.Image != image || !slices.Contains(s.Volumes, "./examples/jaeger/"+conf+":/etc/otelcol/"+conf+":ro") {
					t.Errorf("%s: image %q, volumes %q; want %s with examples/jaeger/%s", name, s.Image, s.Volumes, image, conf)
				}
			}
		}
	}
	samplers, tier1 := byConf["collector-sampler.yaml"], byConf["collector-tier1.yaml"]
	slices.Sort(samplers)
	if len(samplers) < 2 || len(tier1) < 2 {
		t.Fatalf("samplers %q, first-tier collectors %q: want two or more of each", samplers, tier1)
	}
	for _, name := range samplers {
		if jaeger := hostOf(name+" BACKEND_OTLP_GRPC", services[name].Environment["BACKEND_OTLP_GRPC"]); services[jaeger].Image != services["jaeger"].Image {
			t.Errorf("%s sends to %s, image %q; want the Jaeger the tests run, %q", name, jaeger, services[jaeger].Image, services["jaeger"].Image)
		}
	}
	for _, name := range tier1 {
		var listed []string
		if err := yaml.Unmarshal([]byte(services[name].Environment["SAMPLERS"]), &listed); err != nil {
			t.Fatalf("%s SAMPLERS: %v", name, err)
		}
		var hosts []string
		for _, addr := range listed {
			hosts = append(hosts, hostOf(name+" SAMPLERS", addr))
		}
		slices.Sort(hosts)
		if !slices.Equal(hosts, samplers) {
			t.Errorf("%s lists samplers %q, the profile has %q", name, hosts, samplers)
		}
	}
	front, orders, load := services["front"].Environment, services["orders"].Environment, services["load"].Environment
	frontTier, ordersTier := hostOf("front's OTLP endpoint", front["OTEL_EXPORTER_OTLP_ENDPOINT"]), hostOf("orders' OTLP endpoint", orders["OTEL_EXPORTER_OTLP_ENDPOINT"])
	if frontTier == ordersTier || !slices.Contains(tier1, frontTier) || !slices.Contains(tier1, ordersTier) {
		t.Errorf("front sends to %q, orders to %q: want two first-tier collectors", frontTier, ordersTier)
	}
	for _, c := range []struct{ what, url, service, listen string }{
		{"front's DEMO_BACKEND", front["DEMO_BACKEND"], "orders", orders["DEMO_SERVE"]},
		{"load's DEMO_LOAD_VIA", load["DEMO_LOAD_VIA"], "front", front["DEMO_FRONT"]},
	} {
		u, err := url.Parse(c.url)
		if err != nil || hostOf(c.what, c.url) != c.service || ":"+u.Port() != c.listen {
			t.Errorf("%s is %q; %s listens on %q", c.what, c.url, c.service, c.listen)
		}
	}
}
