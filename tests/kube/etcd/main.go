// Command etcd is etcd's own server (etcdmain, the code behind the released etcd
// binary) built from its Go module, so the tests' control plane needs no download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
