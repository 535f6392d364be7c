// Package monitoring_test checks the monitoring bundle (config/prometheus
// and config/grafana) against the code: every PromQL expression of the
// alerts and of the dashboard parses with Prometheus's own parser, every
// metric it names is one the operator (controllers.Collectors) or a worker
// (pkg/worker's registerer) really registers, and every alert has its
// runbook under docs/runbooks with the four headings.
package monitoring_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/shardkeeper/shardkeeper/controllers"
	"github.com/shardkeeper/shardkeeper/internal/testbed/natstest"
	"github.com/shardkeeper/shardkeeper/pkg/worker"
)

var promqlParser = parser.NewParser(parser.Options{})

// recorder is a prometheus.Registerer that keeps the name of every metric
// registered through it: a Worker registers its metrics on the
// Options.Metrics it is given.
type recorder struct{ names map[string]bool }

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		r.names[descName(d)] = true
	}
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r *recorder) Unregister(prometheus.Collector) bool { return true }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// descName reads a Desc's metric name; client_golang exports it only in
// the Desc's String.
func descName(d *prometheus.Desc) string {
	m := fqName.FindStringSubmatch(d.String())
	if m == nil {
		panic("no fqName in " + d.String())
	}
	return m[1]
}

// registered collects the names the operator and a worker register.
func registered(t *testing.T) map[string]bool {
	t.Helper()
	r := &recorder{names: map[string]bool{}}
	r.MustRegister(controllers.Collectors()...)
	nc := natstest.StartCluster(t, 1).Connect(0)
	// OpenRegistry's pool dials lazily and New registers the metrics
	// without reading the registry: the DSN is never contacted.
	reg, err := worker.OpenRegistry(context.Background(), worker.RegistryConfig{DSN: "postgres://shardkeeper@127.0.0.1:1/none"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	_, err = worker.New(worker.Options{
		Topology: "ns/ingest", Member: "ingest-0", NATS: nc, Registry: reg, Metrics: r,
		Handler: func(context.Context, worker.Row) worker.Settlement { return worker.Ack },
	})
	if err != nil {
		t.Fatal(err)
	}
	if !r.names["shardkeeper_units"] || !r.names["shardkeeper_worker_takeovers_total"] {
		t.Fatalf("the registries lack names every bundle uses: %v", r.names)
	}
	return r.names
}

// prometheusOwn are the series Prometheus makes for every target itself.
var prometheusOwn = map[string]bool{"up": true}

// unknownMetrics parses expr and returns the metrics it names that are
// not registered. A histogram's _bucket, _sum and _count series count as
// its name.
func unknownMetrics(expr string, known map[string]bool) ([]string, error) {
	e, err := promqlParser.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var unknown []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				name = m.Value
			}
		}
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && known[b] {
				base = b
			}
		}
		if !known[base] && !prometheusOwn[base] {
			unknown = append(unknown, name)
		}
		return nil
	})
	return unknown, nil
}

// grafanaVars replaces dashboard variables with values PromQL accepts.
var grafanaVars = regexp.MustCompile(`\$\{?(\w+)\}?`)

func substitute(expr string) string {
	return grafanaVars.ReplaceAllStringFunc(expr, func(v string) string {
		if strings.Contains(v, "interval") {
			return "5m"
		}
		return "x"
	})
}

// exprs is one expression to check, with where it comes from.
type exprs struct{ where, expr string }

func ruleGroups(t *testing.T) (*rulefmt.RuleGroups, []exprs) {
	t.Helper()
	b, err := os.ReadFile("rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		Kind string          `json:"kind"`
		Spec json.RawMessage `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &pr); err != nil || pr.Kind != "PrometheusRule" {
		t.Fatalf("rules.yaml is not a PrometheusRule (%v)", err)
	}
	spec, err := yaml.JSONToYAML(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(spec, false, model.UTF8Validation, promqlParser, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("rulefmt refuses rules.yaml: %v", errs)
	}
	var out []exprs
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			out = append(out, exprs{where: "alert " + r.Alert, expr: r.Expr})
		}
	}
	return groups, out
}

func dashboardExprs(t *testing.T) []exprs {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "grafana", "shardkeeper-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query string `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	var out []exprs
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, exprs{where: "panel " + p.Title, expr: substitute(tg.Expr)})
		}
	}
	// label_values(selector, label) is Grafana's, not PromQL: check its
	// selector.
	lv := regexp.MustCompile(`^label_values\((.*), *\w+\)$`)
	for _, v := range d.Templating.List {
		if m := lv.FindStringSubmatch(v.Query); v.Type == "query" && m != nil {
			out = append(out, exprs{where: "variable " + v.Name, expr: substitute(m[1])})
		}
	}
	if len(out) < 15 {
		t.Fatalf("found only %d dashboard expressions", len(out))
	}
	return out
}

// checks P7: what the bundle shows is what the code exports.
func TestRulesAndDashboardNameOnlyRegisteredMetrics(t *testing.T) {
	known := registered(t)
	_, rules := ruleGroups(t)
	all := append(rules, dashboardExprs(t)...)
	for _, e := range all {
		unknown, err := unknownMetrics(e.expr, known)
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", e.where, e.expr, err)
			continue
		}
		if len(unknown) > 0 {
			t.Errorf("%s names metrics nobody registers: %v (registered: %s)", e.where, unknown, strings.Join(sortedKeys(known), ", "))
		}
	}
}

func TestEveryAlertHasARunbookWithTheFourHeadings(t *testing.T) {
	groups, _ := ruleGroups(t)
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			path := filepath.Join("..", "..", "docs", "runbooks", r.Alert+".md")
			b, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("alert %s has no runbook: %v", r.Alert, err)
				continue
			}
			for _, h := range []string{"## Meaning", "## Impact", "## Diagnosis", "## Mitigation"} {
				if !strings.Contains(string(b), "\n"+h+"\n") {
					t.Errorf("%s lacks the heading %q", path, h)
				}
			}
			if url := r.Annotations["runbook_url"]; !strings.HasSuffix(url, "/docs/runbooks/"+r.Alert+".md") {
				t.Errorf("alert %s: runbook_url %q does not point at its runbook", r.Alert, url)
			}
			for _, k := range []string{"summary", "description"} {
				if r.Annotations[k] == "" {
					t.Errorf("alert %s has no %s", r.Alert, k)
				}
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, s)
			}
		}
	}
	if n < 8 {
		t.Fatalf("%d alerts, want at least 8", n)
	}
}

// The check itself catches a misspelled name, a name from before the
// renames, and a histogram series of an unknown histogram; it accepts a
// histogram's bucket series.
func TestTheCheckCatchesMisspelledMetrics(t *testing.T) {
	known := registered(t)
	tests := []struct {
		expr string
		want []string
	}{
		{`shardkeeper_units{state="stalled"} > 0`, nil},
		{`shardkeeper_unit{state="stalled"} > 0`, []string{"shardkeeper_unit"}},
		{`time() - shardkeeper_census_age_seconds`, []string{"shardkeeper_census_age_seconds"}},
		{`rate(shardkeeper_worker_rows_drain_naked_total[5m])`, []string{"shardkeeper_worker_rows_drain_naked_total"}},
		{`histogram_quantile(0.9, rate(shardkeeper_worker_handover_seconds_bucket[5m]))`, nil},
		{`rate(shardkeeper_worker_handover_second_bucket[5m])`, []string{"shardkeeper_worker_handover_second_bucket"}},
		{`{__name__="shardkeeper_worker_fenced_total"}`, []string{"shardkeeper_worker_fenced_total"}},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			got, err := unknownMetrics(tt.expr, known)
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("unknown %v (%v), want %v", got, err, tt.want)
			}
		})
	}
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
