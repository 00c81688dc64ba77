//go:build tools

// Package tools pins kube-apiserver, which `make reference` builds for the
// tests that need a real API server.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
