//go:build tools

// Package tools pins the helm CLI that scripts/k8s-build.sh builds.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
