package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// pkgDecls holds the package-level constants and variables of the packages whose names
// the docs list, by package ("otelpgxtx", "schema", "semconv", "reconcile") and name, so
// that a name can be followed to its string value as the code spells it.
type pkgDecls map[string]map[string]ast.Expr

// loadDecls parses the non-test Go files of the root package, the internal packages that
// name metrics and log fields, internal/schema, reconcile and the semconv version the
// code imports.
func loadDecls(t *testing.T) pkgDecls {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "go.opentelemetry.io/otel").Output()
	if err != nil {
		t.Fatalf("finding the OpenTelemetry module: %v", err)
	}
	semconv := filepath.Join(strings.TrimSpace(string(out)), "semconv", "v1.43.0")
	d := pkgDecls{}
	for pkg, dir := range map[string]string{"otelpgxtx": "..", "schema": "../internal/schema", "metrics": "../internal/metrics",
		"poolmetrics": "../internal/poolmetrics", "auto": "../internal/auto", "logs": "../internal/logs", "reconcile": "../reconcile", "semconv": semconv} {
		d[pkg] = map[string]ast.Expr{}
		for _, f := range goFiles(t, dir) {
			for _, decl := range f.Decls {
				g, ok := decl.(*ast.GenDecl)
				if !ok || (g.Tok != token.CONST && g.Tok != token.VAR) {
					continue
				}
				for _, spec := range g.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							d[pkg][n.Name] = vs.Values[i]
						}
					}
				}
			}
		}
	}
	return d
}

// goFiles parses the non-test Go files of dir.
func goFiles(t *testing.T, dir string) []*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// value returns the string that e, an expression of package pkg, names: a literal, a
// constant or variable (of pkg, or schema., semconv., reconcile.), attribute.Key("…"),
// string(k), or k.String(…) (the key k of an attribute); "" if it is none of those.
func (d pkgDecls) value(pkg string, e ast.Expr) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(e.Value); err == nil {
			return s
		}
	case *ast.Ident:
		if v, ok := d[pkg][e.Name]; ok {
			return d.value(pkg, v)
		}
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok && d[x.Name] != nil {
			return d.value(x.Name, e.Sel)
		}
	case *ast.CallExpr:
		if len(e.Args) == 1 {
			if f, ok := e.Fun.(*ast.Ident); ok && f.Name == "string" {
				return d.value(pkg, e.Args[0])
			}
		}
		if f, ok := e.Fun.(*ast.SelectorExpr); ok {
			if x, ok := f.X.(*ast.Ident); ok && x.Name == "attribute" && f.Sel.Name == "Key" && len(e.Args) == 1 {
				return d.value(pkg, e.Args[0])
			}
			return d.value(pkg, f.X) // k.String(…): the key
		}
	}
	return ""
}

// funcBody returns the declaration of function (or method) name in the files of dir.
func funcBody(t *testing.T, dir, name string) *ast.FuncDecl {
	t.Helper()
	for _, f := range goFiles(t, dir) {
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Name.Name == name {
				return fn
			}
		}
	}
	t.Fatalf("no function %s in %s", name, dir)
	return nil
}

// section returns the part of page from the first line that starts with start up to the
// next line that starts with end (or the page's end).
func section(t *testing.T, page, start, end string) string {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n"+start)
	if i < 0 {
		t.Fatalf("%s has no line starting %q", page, start)
	}
	s = s[i+1:]
	if j := strings.Index(s[len(start):], "\n"+end); j >= 0 {
		s = s[:len(start)+j]
	}
	return s
}

// wantAll reports each of names that text does not hold as a whole word.
func wantAll(t *testing.T, where, text string, names []string) {
	t.Helper()
	for _, n := range names {
		if !regexp.MustCompile(`(^|[^a-z_.])` + regexp.QuoteMeta(n) + `($|[^a-z_])`).MatchString(text) {
			t.Errorf("%s does not list %s", where, n)
		}
	}
}

// TestListsAgreeWithCode: the lists that docs and alert rules give of the code's names
// hold every one, read from the code itself, so that a new one cannot be missing:
//   - the unknown reasons (reconcile's Reason… constants): all of them in the runbook's
//     table; the final ones (those automatic reconciliation does not ask again, per
//     auto.MayChange, which automatic reconciliation and Retry share) in metrics.md's reconciliations row, in the runbook's
//     TransactionReconciledUnknown section and in that alert rule;
//   - the metric names (metric… constants) and the attributes the metrics carry
//     (internal/metrics, internal/poolmetrics) in metrics.md, and every metric an alert rule queries
//     in metrics.md;
//   - the fields of the two log records the operator's command reads (logs.Indeterminate,
//     auto.Reconciler.leave) in the runbook's paragraph on them.
func TestListsAgreeWithCode(t *testing.T) {
	d := loadDecls(t)
	var reasons, final []string
	for name := range d["reconcile"] {
		if strings.HasPrefix(name, "Reason") {
			reasons = append(reasons, d.value("reconcile", d["reconcile"][name]))
		}
	}
	slices.Sort(reasons)
	if len(reasons) < 10 {
		t.Fatalf("%d reasons read from package reconcile: %v", len(reasons), reasons)
	}
	retried := map[string]bool{}
	ast.Inspect(funcBody(t, "../internal/auto", "MayChange"), func(n ast.Node) bool {
		if s, ok := n.(*ast.SelectorExpr); ok && strings.HasPrefix(s.Sel.Name, "Reason") {
			if r := d.value("auto", s); r != "" {
				retried[r] = true
			}
		}
		return true
	})
	for _, r := range reasons {
		if !retried[r] {
			final = append(final, r)
		}
	}
	if len(retried) != 3 {
		t.Errorf("automatic reconciliation asks again on %v: the docs say in_progress, prepared and not_replicated", retried)
	}
	wantAll(t, "runbook.md's table of reasons", section(t, "runbook.md", "| `reason` |", "\n"), reasons)
	wantAll(t, "runbook.md's TransactionReconciledUnknown section", section(t, "runbook.md", "### TransactionReconciledUnknown", "### "), final)
	wantAll(t, "metrics.md's otelpgxtx.reconciliations row", section(t, "metrics.md", "| `otelpgxtx.reconciliations`", "|\n"), final)
	rule := section(t, "../examples/jaeger/alerts.yml", "      - alert: TransactionReconciledUnknown", "      - alert:")
	wantAll(t, "alerts.yml's TransactionReconciledUnknown comment", section(t, "../examples/jaeger/alerts.yml", "        # Reconciliation gave up", "        expr:"), final)
	wantAll(t, "alerts.yml's TransactionReconciledUnknown description", rule[strings.Index(rule, "description:"):], final)

	metricsPage, err := os.ReadFile("metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var names, attrs []string
	for _, pkg := range []string{"metrics", "poolmetrics"} {
		for name, v := range d[pkg] {
			if strings.HasPrefix(name, "Metric") {
				names = append(names, d.value(pkg, v))
			}
		}
	}
	for pkg, f := range map[string]string{"metrics": "internal/metrics/metrics.go", "poolmetrics": "internal/poolmetrics/pool_metrics.go"} {
		file, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", f), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			c, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if s, ok := c.Fun.(*ast.SelectorExpr); ok && slices.Contains([]string{"String", "Int", "Bool"}, s.Sel.Name) {
				if k := d.value(pkg, s.X); strings.Contains(k, ".") && !slices.Contains(attrs, k) {
					attrs = append(attrs, k)
				}
			}
			return true
		})
	}
	if len(names) < 10 || len(attrs) < 8 {
		t.Fatalf("read %d metric names and %d attributes from the code: %v %v", len(names), len(attrs), names, attrs)
	}
	wantAll(t, "metrics.md", string(metricsPage), names)
	for _, a := range attrs {
		// A Prometheus label spells it with underscores.
		if !strings.Contains(string(metricsPage), "`"+a+"`") && !strings.Contains(string(metricsPage), "`"+strings.ReplaceAll(a, ".", "_")+"`") {
			t.Errorf("metrics.md does not name the attribute %s", a)
		}
	}
	alerts, err := os.ReadFile("../examples/jaeger/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`otelpgxtx_[a-z_]+`).FindAllString(string(alerts), -1) {
		// A histogram's series: its name and _bucket, _sum, _count.
		m = strings.TrimSuffix(m, "_")
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			m = strings.TrimSuffix(m, suffix)
		}
		if !strings.Contains(string(metricsPage), "`"+m+"`") {
			t.Errorf("alerts.yml queries %s, which metrics.md does not list", m)
		}
	}

	var fields []string
	for pkg, fn := range map[string]string{"logs": "Indeterminate", "auto": "leave"} {
		ast.Inspect(funcBody(t, "../internal/"+pkg, fn), func(n ast.Node) bool {
			c, ok := n.(*ast.CallExpr)
			if !ok || len(c.Args) == 0 {
				return true
			}
			if s, ok := c.Fun.(*ast.SelectorExpr); ok {
				if x, ok := s.X.(*ast.Ident); ok && x.Name == "slog" && s.Sel.Name != "Default" {
					if k := d.value(pkg, c.Args[0]); k != "" && !slices.Contains(fields, k) {
						fields = append(fields, k)
					}
				}
			}
			return true
		})
	}
	if len(fields) < 8 {
		t.Fatalf("read %d log record fields from the code: %v", len(fields), fields)
	}
	wantAll(t, "runbook.md's paragraph on the log records", section(t, "runbook.md", "They go to the logger of `WithLogger`", "\n"), fields)
}

// referencePrices reads the commit references' figures from performance.md's table of the
// latest side-by-side run (the section referenceTable names): the ranges of g/c and h/c
// over the loopback rows, each at the 2.5 ms round trip, and the ranges of the server CPU
// they add (h on loopback; g in the scaling runs), as the README's options table gives
// them.
func referencePrices(t *testing.T) []string {
	t.Helper()
	const referenceTable = "### The xid read after a statement, the marker by name"
	var gLoop, hLoop, hCPU, gScaleCPU []float64
	var gRTT, hRTT float64
	for _, line := range strings.Split(section(t, "performance.md", referenceTable, "### "), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 9 || !strings.Contains(cells[1], "goroutine") {
			continue
		}
		num := func(i int) float64 {
			v, err := strconv.ParseFloat(strings.NewReplacer("−", "-", "+", "", ",", "", "¹", "").Replace(strings.TrimSpace(cells[i])), 64)
			if err != nil {
				t.Fatalf("performance.md: %q: %v", line, err)
			}
			return v
		}
		if strings.Contains(cells[1], "round trip") {
			gRTT, hRTT = num(3), num(4)
			continue
		}
		gLoop, hLoop, hCPU = append(gLoop, num(3)), append(hLoop, num(4)), append(hCPU, num(7))
		if strings.Contains(cells[1], "TxScale") || !strings.Contains(cells[1], "Tx") {
			gScaleCPU = append(gScaleCPU, num(6))
		}
	}
	if len(gLoop) != 4 || gRTT == 0 || len(gScaleCPU) != 3 {
		t.Fatalf("performance.md's table: %d loopback rows, %d scaling rows, round trip %v", len(gLoop), len(gScaleCPU), gRTT)
	}
	signed := func(v float64) string {
		if v < 0 {
			return fmt.Sprintf("−%.0f", -v)
		}
		return fmt.Sprintf("+%.0f", v)
	}
	return []string{
		fmt.Sprintf("%.2f–%.2f× its tx/s on loopback at 1–64 goroutines, %.2f× at 2.5 ms round trip", slices.Min(gLoop), slices.Max(gLoop), gRTT),
		fmt.Sprintf("%s to %s µs of server CPU in the scaling runs", signed(slices.Min(gScaleCPU)), signed(slices.Max(gScaleCPU))),
		fmt.Sprintf("%.2f–%.2f× the tracer's tx/s on loopback, %.2f× at 2.5 ms, +%.0f–%.0f µs of server CPU per commit on loopback", slices.Min(hLoop), slices.Max(hLoop), hRTT, slices.Min(hCPU), slices.Max(hCPU)),
	}
}

// TestOptionPricesFromPerformance: the README's options table gives the commit references'
// prices as performance.md measured them, so a new run's figures cannot leave it behind.
func TestOptionPricesFromPerformance(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range referencePrices(t) {
		if !strings.Contains(string(readme), want) {
			t.Errorf("the README's options table does not say %q (performance.md's figures)", want)
		}
	}
}
