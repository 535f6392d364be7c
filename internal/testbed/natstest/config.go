package natstest

import (
	"fmt"
	"strings"
)

// Accounts and users every test server has. APP owns the streams; SYS is
// the system account the census needs.
const (
	AppAccount  = "APP"
	AppUser     = "app"
	AppPassword = "app-secret"
	SysAccount  = "SYS"
	SysUser     = "sys"
	SysPassword = "sys-secret"
)

// ServerConfig is one server's configuration, rendered to the nats-server
// configuration language so the same text starts an in-process server and a
// separate binary of another version.
type ServerConfig struct {
	Name        string
	Port        int
	StoreDir    string
	ClusterName string
	ClusterPort int   // 0: no cluster block
	Routes      []int // cluster ports of the peers
	// Extra is appended verbatim (leafnode blocks, limits).
	Extra string
}

// Render returns the configuration text.
func (c ServerConfig) Render() string {
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %q\nlisten: \"127.0.0.1:%d\"\n", c.Name, c.Port)
	fmt.Fprintf(&b, "jetstream { store_dir: %q, max_memory_store: 256MB, max_file_store: 2GB }\n", c.StoreDir)
	if c.ClusterPort != 0 {
		fmt.Fprintf(&b, "cluster {\n  name: %q\n  listen: \"127.0.0.1:%d\"\n  routes: [", c.ClusterName, c.ClusterPort)
		for i, p := range c.Routes {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "\"nats-route://127.0.0.1:%d\"", p)
		}
		b.WriteString("]\n}\n")
	}
	fmt.Fprintf(&b, `accounts {
  %s { jetstream: enabled, users: [ { user: %q, password: %q } ] }
  %s { users: [ { user: %q, password: %q } ] }
}
system_account: %s
`, AppAccount, AppUser, AppPassword, SysAccount, SysUser, SysPassword, SysAccount)
	b.WriteString(c.Extra)
	return b.String()
}
