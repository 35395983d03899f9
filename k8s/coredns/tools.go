//go:build tools

// Package tools pins CoreDNS, which scripts/k8s-build.sh builds for the cluster's DNS.
package tools

import _ "github.com/coredns/coredns"
