// Package argocd holds the Argo CD health check for ShardTopology and its
// tests, which run the Lua in gopher-lua, the runtime Argo CD embeds.
package argocd

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"
)

// runHealth runs health.lua on obj (a ShardTopology as JSON) the way Argo CD
// does: obj is a global table and the script returns {status, message}.
func runHealth(t *testing.T, script string, obj string) (status, message string) {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(obj), &v); err != nil {
		t.Fatal(err)
	}
	L := lua.NewState()
	defer L.Close()
	L.SetGlobal("obj", toLua(L, v))
	if err := L.DoString(script); err != nil {
		t.Fatalf("health.lua: %v", err)
	}
	hs, ok := L.Get(-1).(*lua.LTable)
	if !ok {
		t.Fatalf("health.lua returned %s, want a table", L.Get(-1).Type())
	}
	return hs.RawGetString("status").String(), hs.RawGetString("message").String()
}

func toLua(L *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case map[string]any:
		t := L.NewTable()
		for k, e := range x {
			t.RawSetString(k, toLua(L, e))
		}
		return t
	case []any:
		t := L.NewTable()
		for _, e := range x {
			t.Append(toLua(L, e))
		}
		return t
	case string:
		return lua.LString(x)
	case float64:
		return lua.LNumber(x)
	case bool:
		return lua.LBool(x)
	default:
		return lua.LNil
	}
}

func TestHealth(t *testing.T) {
	script, err := os.ReadFile("health.lua")
	if err != nil {
		t.Fatal(err)
	}
	cond := func(typ, status, reason string) string {
		return `{"type":"` + typ + `","status":"` + status + `","reason":"` + reason + `","message":"m"}`
	}
	obj := func(gen, observed int, conds ...string) string {
		return `{"metadata":{"generation":` + itoa(gen) + `},"status":{"observedGeneration":` + itoa(observed) +
			`,"conditions":[` + strings.Join(conds, ",") + `]}}`
	}
	tests := []struct {
		name, obj, want string
	}{
		{"no status yet is progressing", `{"metadata":{"generation":1}}`, "Progressing"},
		{"first sight is progressing", obj(1, 0, cond("Ready", "Unknown", "FirstSeen"), cond("Reconciling", "True", "FirstSeen")), "Progressing"},
		{"an unobserved generation is progressing even if ready", obj(2, 1, cond("Ready", "True", "Ready")), "Progressing"},
		{"stalled is degraded", obj(1, 1, cond("Stalled", "True", "SecretNotFound"), cond("Ready", "False", "SecretNotFound")), "Degraded"},
		{"paused mid-rollout is suspended", obj(1, 1, cond("RolloutPaused", "True", "Paused"), cond("Ready", "False", "RollingOut")), "Suspended"},
		{"a plan waiting for approval is suspended", obj(1, 1, cond("Reconciling", "True", "AwaitingApproval"), cond("Ready", "False", "AwaitingApproval")), "Suspended"},
		{"a refused approval is suspended too", obj(1, 1, cond("Reconciling", "True", "ApprovalRefused"), cond("Ready", "False", "ApprovalRefused")), "Suspended"},
		{"rolling out is progressing", obj(1, 1, cond("Reconciling", "True", "RollingOut"), cond("Ready", "False", "RollingOut")), "Progressing"},
		{"ready at the current generation is healthy", obj(3, 3, cond("Ready", "True", "Ready"), cond("Reconciling", "False", "Ready"), cond("Stalled", "False", "SpecValid")), "Healthy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, msg := runHealth(t, string(script), tt.obj)
			if got != tt.want {
				t.Fatalf("status %s (%s), want %s", got, msg, tt.want)
			}
		})
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// TestPatchCarriesTheSameScript keeps argocd-cm-patch.yaml in step with
// health.lua.
func TestPatchCarriesTheSameScript(t *testing.T) {
	script, err := os.ReadFile("health.lua")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("argocd-cm-patch.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(b, &cm); err != nil {
		t.Fatal(err)
	}
	got := cm.Data["resource.customizations.health.topology.shardkeeper.dev_ShardTopology"]
	if strings.TrimSpace(got) != strings.TrimSpace(string(script)) {
		t.Fatalf("argocd-cm-patch.yaml's script differs from health.lua")
	}
}
