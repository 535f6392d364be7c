package verify

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/shardkeeper/shardkeeper/internal/testbed"
)

// grant is one permission: a verb on a resource of an API group (names
// empty: every object of the resource).
type grant struct{ group, resource, name, verb string }

func (g grant) String() string {
	s := g.verb + " " + g.resource
	if g.group != "" {
		s += "." + g.group
	}
	if g.name != "" {
		s += "/" + g.name
	}
	return s
}

var rbacMarker = regexp.MustCompile(`^\s*//\s*\+kubebuilder:rbac:(.+)$`)

// markerGrants reads every +kubebuilder:rbac marker of the reconciler's
// package, without controller-gen: the test checks the role against what
// the code declares, not against the generator.
func markerGrants(t *testing.T, dir string) map[grant]string {
	t.Helper()
	// The same files hack/generate.sh gives controller-gen
	// (paths=./controllers/...): every non-test Go file below dir.
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[grant]string{}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		for line := 1; sc.Scan(); line++ {
			m := rbacMarker.FindStringSubmatch(sc.Text())
			if m == nil {
				continue
			}
			fields := map[string][]string{}
			for _, kv := range strings.Split(m[1], ",") {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					t.Fatalf("%s:%d: marker part %q is not key=value", f, line, kv)
				}
				fields[k] = strings.Split(strings.Trim(v, `"`), ";")
			}
			if _, ok := fields["namespace"]; ok {
				t.Fatalf("%s:%d: namespaced RBAC markers are not expected by this check", f, line)
			}
			rel, _ := filepath.Rel(dir, f)
			where := rel + ":" + strconv.Itoa(line)
			for _, g := range expand(fields["groups"], fields["resources"], fields["resourceNames"], fields["verbs"]) {
				out[g] = where
			}
		}
		fh.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func expand(groups, resources, names, verbs []string) []grant {
	if len(names) == 0 {
		names = []string{""}
	}
	var out []grant
	for _, g := range groups {
		for _, r := range resources {
			for _, n := range names {
				for _, v := range verbs {
					out = append(out, grant{g, r, n, v})
				}
			}
		}
	}
	return out
}

// TestRoleGrantsExactlyWhatTheMarkersDeclare parses config/rbac/role.yaml
// and the reconciler's +kubebuilder:rbac markers and compares the two
// permission sets: the ClusterRole the operator runs under must grant
// nothing the code does not declare it needs (least privilege), and
// nothing declared may be missing. Wildcards are refused outright.
func TestRoleGrantsExactlyWhatTheMarkersDeclare(t *testing.T) {
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	declared := markerGrants(t, filepath.Join(root, "controllers"))
	if len(declared) == 0 {
		t.Fatal("no +kubebuilder:rbac markers found in controllers/: the check would compare nothing")
	}
	b, err := os.ReadFile(filepath.Join(root, "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(b, &role); err != nil {
		t.Fatal(err)
	}
	if role.Kind != "ClusterRole" || role.Name != "shardkeeper-manager" {
		t.Fatalf("config/rbac/role.yaml holds %s %q, want ClusterRole shardkeeper-manager", role.Kind, role.Name)
	}
	granted := map[grant]bool{}
	for i, r := range role.Rules {
		if len(r.NonResourceURLs) > 0 {
			t.Errorf("rule %d grants non-resource URLs %v; the reconciler declares none", i, r.NonResourceURLs)
		}
		for _, field := range [][]string{r.APIGroups, r.Resources, r.ResourceNames, r.Verbs} {
			if slices.Contains(field, "*") {
				t.Errorf("rule %d uses a wildcard (%+v): grant each verb and resource by name", i, r)
			}
		}
		for _, g := range expand(r.APIGroups, r.Resources, r.ResourceNames, r.Verbs) {
			granted[g] = true
		}
	}
	for g := range granted {
		if _, ok := declared[g]; !ok {
			t.Errorf("role.yaml grants %s, which no +kubebuilder:rbac marker declares: remove it, or declare it beside the code that needs it and run make generate", g)
		}
	}
	for g, where := range declared {
		if !granted[g] {
			t.Errorf("the marker at controllers/%s declares %s, which role.yaml lacks: run make generate", where, g)
		}
	}
}

// TestRoleBindingGivesTheRoleToTheOperatorOnly checks that config/rbac
// binds shardkeeper-manager to the operator's ServiceAccount and nobody
// else.
func TestRoleBindingGivesTheRoleToTheOperatorOnly(t *testing.T) {
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "config", "rbac", "role_binding.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crb rbacv1.ClusterRoleBinding
	if err := yaml.Unmarshal(b, &crb); err != nil {
		t.Fatal(err)
	}
	want := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "shardkeeper", Namespace: "shardkeeper-system"}}
	if crb.RoleRef.Kind != "ClusterRole" || crb.RoleRef.Name != "shardkeeper-manager" || !slices.Equal(crb.Subjects, want) {
		t.Fatalf("role_binding.yaml binds %s %s to %+v, want ClusterRole shardkeeper-manager to %+v", crb.RoleRef.Kind, crb.RoleRef.Name, crb.Subjects, want)
	}
}
