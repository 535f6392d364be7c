// Command etcd is the upstream etcd server, built from its Go module so
// envtest can run it without downloading release binaries.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
