//go:build tools

// Package tools pins the etcd server (and etcdctl, for debugging a test cluster) that
// scripts/k8s-build.sh builds. They are built as dependencies of this module because their
// own go.mod files carry replace directives, which `go install pkg@version` refuses.
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
