package helmchart

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"sigs.k8s.io/yaml"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
	"github.com/shardkeeper/shardkeeper/internal/testbed/kubetest"
)

const (
	// namespace is the release's namespace, and the one config/ installs in.
	namespace = "shardkeeper-system"
	imageRepo = "registry.example/shardkeeper"
	imageTag  = "v9.8.7"
)

// helmLabels are the labels the chart adds to every object beyond those of
// config/ (templates/_helpers.tpl, shardkeeper.helmLabels): the only
// difference the comparison forgives, besides the CRD's keep policy and
// the Namespace object (Helm's release namespace is made by
// `helm install --create-namespace`, not by the chart).
var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

func TestChartFilesAreCopiesOfConfig(t *testing.T) {
	root := repoRoot(t)
	for copyName, source := range map[string]string{
		"crd.yaml":                   "config/crd/bases/topology.shardkeeper.dev_shardtopologies.yaml",
		"manager-role.yaml":          "config/rbac/role.yaml",
		"servicemonitor.yaml":        "config/prometheus/monitor.yaml",
		"podmonitor.yaml":            "config/prometheus/podmonitor.yaml",
		"prometheusrule.yaml":        "config/prometheus/rules.yaml",
		"shardkeeper-dashboard.json": "config/grafana/shardkeeper-dashboard.json",
	} {
		got, err := os.ReadFile(filepath.Join(root, "charts", "shardkeeper", "files", copyName))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join(root, source))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("charts/shardkeeper/files/%s differs from %s: run hack/chart-sync.sh (make generate)", copyName, source)
		}
	}
}

func TestHelmLintPassesInBothModes(t *testing.T) {
	root := repoRoot(t)
	for _, values := range []map[string]any{
		{},
		{"namespaced": true},
		{"monitoring": map[string]any{"serviceMonitor": on, "podMonitor": on, "prometheusRule": on, "grafanaDashboard": on}},
	} {
		t.Run(fmt.Sprint(values), func(t *testing.T) {
			lint := action.NewLint()
			lint.Strict = true
			lint.Namespace = namespace
			res := lint.Run([]string{filepath.Join(root, "charts", "shardkeeper")}, values)
			for _, m := range res.Messages {
				t.Log(m)
			}
			if len(res.Errors) > 0 || action.HasWarningsOrErrors(res) {
				t.Fatalf("helm lint --strict: %v", res.Errors)
			}
			if res.TotalChartsLinted != 1 {
				t.Fatalf("linted %d charts, want 1", res.TotalChartsLinted)
			}
		})
	}
}

var on = map[string]any{"enabled": true}

// TestChartRendersTheSameObjectsAsKustomize renders the chart and the
// kustomization it mirrors and compares them object by object: a change to
// config/ that the chart does not follow (or the reverse) fails here.
func TestChartRendersTheSameObjectsAsKustomize(t *testing.T) {
	root := repoRoot(t)
	image := map[string]any{"repository": imageRepo, "tag": imageTag}
	monitoringOn := map[string]any{"serviceMonitor": on, "podMonitor": on, "prometheusRule": on, "grafanaDashboard": on}
	for _, tc := range []struct {
		name   string
		values map[string]any
		// kustomizations the chart must equal, together.
		configs []string
	}{
		{"cluster-wide equals dist/install.yaml", map[string]any{"image": image}, []string{"config/default"}},
		{"namespaced equals config/namespaced", map[string]any{"image": image, "namespaced": true}, []string{"config/namespaced"}},
		{"monitoring toggles add config/prometheus and config/grafana", map[string]any{"image": image, "monitoring": monitoringOn}, []string{"config/default", "config/prometheus", "config/grafana"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := map[string]map[string]any{}
			for _, config := range tc.configs {
				for k, o := range objects(t, renderKustomize(t, root, config)) {
					want[k] = o
				}
			}
			got := objects(t, renderChart(t, root, tc.values))

			// The forgiven differences, each checked to be there.
			nsKey := key(map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": namespace}})
			if _, ok := want[nsKey]; !ok {
				t.Fatalf("kustomize rendered no Namespace %s: the comparison's assumptions are stale", namespace)
			}
			delete(want, nsKey)
			for k, o := range got {
				stripHelmLabels(t, k, o)
				if o["kind"] == "CustomResourceDefinition" {
					ann := o["metadata"].(map[string]any)["annotations"].(map[string]any)
					if ann["helm.sh/resource-policy"] != "keep" {
						t.Errorf("%s: annotation helm.sh/resource-policy = %v, want keep (uninstall must not delete every ShardTopology)", k, ann["helm.sh/resource-policy"])
					}
					delete(ann, "helm.sh/resource-policy")
					if len(ann) == 0 {
						delete(o["metadata"].(map[string]any), "annotations")
					}
				}
			}

			var missing, extra []string
			for k := range want {
				if _, ok := got[k]; !ok {
					missing = append(missing, k)
				}
			}
			for k := range got {
				if _, ok := want[k]; !ok {
					extra = append(extra, k)
				}
			}
			sort.Strings(missing)
			sort.Strings(extra)
			if len(missing) > 0 || len(extra) > 0 {
				t.Fatalf("objects differ:\n  only in %v: %v\n  only in the chart: %v", tc.configs, missing, extra)
			}
			for k, w := range want {
				if d := cmp.Diff(w, got[k]); d != "" {
					t.Errorf("%s differs (-%v +chart):\n%s", k, tc.configs, d)
				}
			}
			t.Logf("%d objects equal", len(want))
		})
	}
}

// TestChartValuesDoWhatValuesYamlSays renders the chart with each value
// changed and checks the object it governs.
func TestChartValuesDoWhatValuesYamlSays(t *testing.T) {
	root := repoRoot(t)
	for _, tc := range []struct {
		name   string
		values map[string]any
		check  func(t *testing.T, objs map[string]map[string]any)
	}{
		{"the tag defaults to the chart's appVersion", map[string]any{}, func(t *testing.T, objs map[string]map[string]any) {
			c := loadChart(t, root)
			if img := container(t, objs)["image"]; img != "shardkeeper:"+c.Metadata.AppVersion {
				t.Errorf("image = %v, want shardkeeper:%s", img, c.Metadata.AppVersion)
			}
		}},
		{"a digest pins the image", map[string]any{"image": map[string]any{"repository": imageRepo, "digest": "sha256:" + strings.Repeat("ab", 32)}}, func(t *testing.T, objs map[string]map[string]any) {
			if img := container(t, objs)["image"]; img != imageRepo+"@sha256:"+strings.Repeat("ab", 32) {
				t.Errorf("image = %v", img)
			}
		}},
		{"replicas 1 drops the PodDisruptionBudget", map[string]any{"replicas": 1}, func(t *testing.T, objs map[string]map[string]any) {
			if n := deployment(t, objs)["spec"].(map[string]any)["replicas"]; n != float64(1) {
				t.Errorf("replicas = %v", n)
			}
			mustNotHave(t, objs, "PodDisruptionBudget")
		}},
		{"resources replace the defaults", map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "1Gi"}}}, func(t *testing.T, objs map[string]map[string]any) {
			res := container(t, objs)["resources"].(map[string]any)
			if res["limits"].(map[string]any)["memory"] != "1Gi" {
				t.Errorf("resources = %v", res)
			}
		}},
		{"leader election off with one replica", map[string]any{"replicas": 1, "leaderElection": map[string]any{"enabled": false}}, func(t *testing.T, objs map[string]map[string]any) {
			if args := args(t, objs); slices.Contains(args, "--leader-elect") {
				t.Errorf("args %v still elect a leader", args)
			}
			mustNotHave(t, objs, "Role/shardkeeper-leader-election")
		}},
		{"log level", map[string]any{"logLevel": "debug"}, func(t *testing.T, objs map[string]map[string]any) {
			if args := args(t, objs); !slices.Contains(args, "--zap-log-level=debug") {
				t.Errorf("args %v lack --zap-log-level=debug", args)
			}
		}},
		{"metrics off drops the endpoint, its Service and its RBAC", map[string]any{"metrics": map[string]any{"enabled": false}, "monitoring": map[string]any{"serviceMonitor": on}}, func(t *testing.T, objs map[string]map[string]any) {
			if args := args(t, objs); !slices.Contains(args, "--metrics-bind-address=0") {
				t.Errorf("args %v still serve metrics", args)
			}
			mustNotHave(t, objs, "Service/shardkeeper-metrics")
			mustNotHave(t, objs, "ClusterRole/shardkeeper-metrics-auth")
			mustNotHave(t, objs, "ServiceMonitor")
		}},
		{"metrics port", map[string]any{"metrics": map[string]any{"enabled": true, "port": 9443}}, func(t *testing.T, objs map[string]map[string]any) {
			if args := args(t, objs); !slices.Contains(args, "--metrics-bind-address=:9443") {
				t.Errorf("args %v", args)
			}
		}},
		{"crds.create false leaves the CRD out", map[string]any{"crds": map[string]any{"create": false}}, func(t *testing.T, objs map[string]map[string]any) {
			mustNotHave(t, objs, "CustomResourceDefinition")
		}},
		{"monitoring is off by default", map[string]any{}, func(t *testing.T, objs map[string]map[string]any) {
			for _, kind := range []string{"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"} {
				mustNotHave(t, objs, kind)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, objects(t, renderChart(t, root, tc.values)))
		})
	}

	t.Run("several replicas without leader election are refused", func(t *testing.T) {
		_, err := render(t, root, map[string]any{"replicas": 2, "leaderElection": map[string]any{"enabled": false}})
		if err == nil || !strings.Contains(err.Error(), "leaderElection.enabled") {
			t.Fatalf("render: %v, want an error naming leaderElection.enabled", err)
		}
	})
}

// TestChartIsAcceptedByTheAPIServer applies what the chart renders, in both
// modes, to the test bed's API server with a server-side dry run: every
// object passes admission and the CRD's own validation.
func TestChartIsAcceptedByTheAPIServer(t *testing.T) {
	root := repoRoot(t)
	env, err := kubetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	// A dry run creates nothing: the release namespace must exist, as
	// `helm install --create-namespace` would make it.
	if _, err := env.Kubectl(nil, "create", "namespace", namespace); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		values map[string]any
	}{
		{"cluster-wide", map[string]any{}},
		{"namespaced", map[string]any{"namespaced": true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			manifest := renderChart(t, root, tc.values)
			out, err := env.Kubectl(manifest, "apply", "--dry-run=server", "-f", "-")
			if err != nil {
				t.Fatal(err)
			}
			n := len(objects(t, manifest))
			if got := strings.Count(string(out), "(server dry run)"); got != n {
				t.Fatalf("the API server accepted %d of %d objects:\n%s", got, n, out)
			}
			t.Logf("%d objects accepted", n)
		})
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func loadChart(t *testing.T, root string) *chart.Chart {
	t.Helper()
	c, err := loader.Load(filepath.Join(root, "charts", "shardkeeper"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// render is `helm template`: an install with a client-only dry run.
func render(t *testing.T, root string, values map[string]any) ([]byte, error) {
	t.Helper()
	install := action.NewInstall(&action.Configuration{})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.IncludeCRDs = true
	install.ReleaseName = "shardkeeper"
	install.Namespace = namespace
	kv, err := chartutil.ParseKubeVersion("v1.37.0")
	if err != nil {
		t.Fatal(err)
	}
	install.KubeVersion = kv
	rel, err := install.Run(loadChart(t, root), values)
	if err != nil {
		return nil, err
	}
	return []byte(rel.Manifest), nil
}

func renderChart(t *testing.T, root string, values map[string]any) []byte {
	t.Helper()
	out, err := render(t, root, values)
	if err != nil {
		t.Fatalf("render the chart with %v: %v", values, err)
	}
	return out
}

// renderKustomize renders config with the operator image pinned as the
// chart's values pin it, through hack/install-manifest.sh as
// `make install-manifest` does.
func renderKustomize(t *testing.T, root, config string) []byte {
	t.Helper()
	if config != "config/default" && config != "config/namespaced" {
		out, err := kubetest.Kustomize(filepath.Join(root, config))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	out := filepath.Join(t.TempDir(), "install.yaml")
	cmd := exec.Command(filepath.Join(root, "hack", "install-manifest.sh"), imageRepo+":"+imageTag, out, config)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/install-manifest.sh: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// objects parses a multi-document manifest into objects keyed by kind,
// namespace and name, decoded through JSON so that both sides' numbers
// compare alike.
func objects(t *testing.T, manifest []byte) map[string]map[string]any {
	t.Helper()
	objs := map[string]map[string]any{}
	for _, doc := range bytes.Split(manifest, []byte("\n---")) {
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("parse %q: %v", firstLine(doc), err)
		}
		if len(o) == 0 {
			continue
		}
		k := key(o)
		if _, dup := objs[k]; dup {
			t.Fatalf("%s rendered twice", k)
		}
		objs[k] = o
	}
	return objs
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

func key(o map[string]any) string {
	md, _ := o["metadata"].(map[string]any)
	ns, _ := md["namespace"].(string)
	return fmt.Sprintf("%s %s %s/%s", o["apiVersion"], o["kind"], ns, md["name"])
}

func stripHelmLabels(t *testing.T, k string, o map[string]any) {
	t.Helper()
	md := o["metadata"].(map[string]any)
	labels, _ := md["labels"].(map[string]any)
	for _, l := range helmLabels {
		if _, ok := labels[l]; !ok {
			t.Errorf("%s lacks the label %s", k, l)
		}
		delete(labels, l)
	}
	if len(labels) == 0 {
		delete(md, "labels")
	}
}

func find(t *testing.T, objs map[string]map[string]any, kindName string) []map[string]any {
	t.Helper()
	kind, name, _ := strings.Cut(kindName, "/")
	var found []map[string]any
	for _, o := range objs {
		if o["kind"] == kind && (name == "" || o["metadata"].(map[string]any)["name"] == name) {
			found = append(found, o)
		}
	}
	return found
}

func mustNotHave(t *testing.T, objs map[string]map[string]any, kindName string) {
	t.Helper()
	if found := find(t, objs, kindName); len(found) > 0 {
		t.Errorf("rendered %s, want none", kindName)
	}
}

func deployment(t *testing.T, objs map[string]map[string]any) map[string]any {
	t.Helper()
	found := find(t, objs, "Deployment/shardkeeper")
	if len(found) != 1 {
		t.Fatalf("rendered %d Deployments shardkeeper, want 1", len(found))
	}
	return found[0]
}

func container(t *testing.T, objs map[string]map[string]any) map[string]any {
	t.Helper()
	spec := deployment(t, objs)["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	return spec["containers"].([]any)[0].(map[string]any)
}

func args(t *testing.T, objs map[string]map[string]any) []string {
	t.Helper()
	var out []string
	for _, a := range container(t, objs)["args"].([]any) {
		out = append(out, a.(string))
	}
	return out
}
