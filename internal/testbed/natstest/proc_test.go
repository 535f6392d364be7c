package natstest

import (
	"encoding/json"
	"net"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// pingVersions asks every server reachable through nc's system account for
// its STATSZ and returns name -> version, waiting up to a second for more.
func pingVersions(t *testing.T, nc *nats.Conn, want int) map[string]string {
	t.Helper()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SYS.REQ.SERVER.PING.STATSZ", inbox, nil); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for len(got) < want {
		m, err := sub.NextMsg(time.Second)
		if err != nil {
			break
		}
		var r struct {
			Server struct {
				Name string `json:"name"`
				Ver  string `json:"ver"`
			} `json:"server"`
		}
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		got[r.Server.Name] = r.Server.Ver
	}
	return got
}

func TestProcClusterMixesServerVersions(t *testing.T) {
	c := StartProcCluster(t, Binary(t, Version214), Binary(t, Version214), Binary(t, Version212))
	got := pingVersions(t, c.ConnectSys(0), 3)
	want := map[string]string{c.Configs[0].Name: "2.14.9", c.Configs[1].Name: "2.14.9", c.Configs[2].Name: "2.12.15"}
	if len(got) != 3 {
		t.Fatalf("got %v, want %v", got, want)
	}
	for n, v := range want {
		if got[n] != v {
			t.Fatalf("server %s runs %q, want %q (all: %v)", n, got[n], v, got)
		}
	}
}

func TestProcClusterStartsAgainWhenAPortIsTakenBeforeItsServerBindsIt(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	attempts := 0
	c := StartProcClusterWith(t, func(_ int, cfg *ServerConfig) {
		attempts++
		cfg.LeafPort = freePort(t)
		if attempts == 1 {
			cfg.LeafPort = taken.Addr().(*net.TCPAddr).Port
		}
	}, Binary(t, Version214))
	if attempts != 2 {
		t.Fatalf("configured %d times, want 2 (the first on a taken port)", attempts)
	}
	c.Connect(0)
}

func TestProcRestartsAfterKill(t *testing.T) {
	c := StartProcCluster(t, Binary(t, Version214))
	p := c.Procs[0]
	p.Kill()
	if p.Running() {
		t.Fatal("killed server still running")
	}
	c.Restart(0)
	if !p.Running() {
		t.Fatal("restarted server not running")
	}
	c.Connect(0)
}

func TestLeafBindingSystemAccountSeesHub(t *testing.T) {
	hub := StartClusterWith(t, 3, WithLeafPorts(t))
	leaf := StartClusterWith(t, 1, func(_ int, cfg *ServerConfig) {
		cfg.Name = hub.Name + "-leaf"
		cfg.Domain = "leaf"
		cfg.LeafRemotes = []LeafRemote{
			{Account: AppAccount, URLs: hub.LeafURLs(AppUser, AppPassword)},
			{Account: SysAccount, URLs: hub.LeafURLs(SysUser, SysPassword)},
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	var names []string
	for time.Now().Before(deadline) {
		got := pingVersions(t, leaf.ConnectSys(0), 4)
		names = names[:0]
		for n := range got {
			names = append(names, n)
		}
		if len(got) == 4 {
			return
		}
	}
	sort.Strings(names)
	t.Fatalf("leaf bound to SYS saw %v, want the 3 hub servers and itself", names)
}
