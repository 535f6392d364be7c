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
	// Extra is appended verbatim (limits, tags).
	Extra string
	// AppJetStream is the APP account's jetstream setting: empty means
	// "enabled" (no account limits); a block such as
	// "{ max_consumers: 1500 }" sets the account's limits.
	AppJetStream string

	// Domain is the JetStream domain; servers on both ends of a leafnode
	// connection need different domains to keep their JetStream apart.
	Domain string
	// NoJetStream leaves JetStream off.
	NoJetStream bool
	// LeafPort, when not 0, makes the server a leafnode hub listening on it.
	// Leaves authenticate as the ordinary users of the account they bind.
	LeafPort int
	// LeafRemotes make the server a leaf of a hub, one connection per
	// remote (and so per account bound across it).
	LeafRemotes []LeafRemote
}

// LeafRemote is one leafnode remote: the local account it binds and the
// hub's leafnode URLs, credentials included (see LeafURL).
type LeafRemote struct {
	Account string
	URLs    []string
}

// LeafURL is a hub's leafnode URL that logs in as user, which binds the
// leaf connection to that user's account on the hub.
func LeafURL(port int, user, pass string) string {
	return fmt.Sprintf("nats-leaf://%s:%s@127.0.0.1:%d", user, pass, port)
}

// Render returns the configuration text.
func (c ServerConfig) Render() string {
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %q\nlisten: \"127.0.0.1:%d\"\n", c.Name, c.Port)
	if !c.NoJetStream {
		domain := ""
		if c.Domain != "" {
			domain = fmt.Sprintf(", domain: %q", c.Domain)
		}
		fmt.Fprintf(&b, "jetstream { store_dir: %q, max_memory_store: 256MB, max_file_store: 2GB%s }\n", c.StoreDir, domain)
	}
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
	appJS := c.AppJetStream
	if appJS == "" {
		appJS = "enabled"
	}
	fmt.Fprintf(&b, `accounts {
  %s { jetstream: %s, users: [ { user: %q, password: %q } ] }
  %s { users: [ { user: %q, password: %q } ] }
}
system_account: %s
`, AppAccount, appJS, AppUser, AppPassword, SysAccount, SysUser, SysPassword, SysAccount)
	c.renderLeafnodes(&b)
	b.WriteString(c.Extra)
	return b.String()
}

func (c ServerConfig) renderLeafnodes(b *strings.Builder) {
	if c.LeafPort == 0 && len(c.LeafRemotes) == 0 {
		return
	}
	b.WriteString("leafnodes {\n")
	if c.LeafPort != 0 {
		fmt.Fprintf(b, "  listen: \"127.0.0.1:%d\"\n", c.LeafPort)
	}
	if len(c.LeafRemotes) > 0 {
		b.WriteString("  remotes: [\n")
		for _, r := range c.LeafRemotes {
			b.WriteString("    { urls: [")
			for i, u := range r.URLs {
				if i > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(b, "%q", u)
			}
			fmt.Fprintf(b, "], account: %q }\n", r.Account)
		}
		b.WriteString("  ]\n")
	}
	b.WriteString("}\n")
}
