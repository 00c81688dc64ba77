//go:build tools

// Package tools pins the Istio binaries that `make reference` builds, so that
// go.sum records them alongside the packages xdsdump imports.
package tools

import (
	_ "istio.io/istio/istioctl/cmd/istioctl"
	_ "istio.io/istio/pilot/cmd/pilot-agent"
	_ "istio.io/istio/pilot/cmd/pilot-discovery"
)
