//go:build tools

// Package tools pins the etcd server that kube-apiserver stores into in the
// tests that need a real API server.
package tools

import _ "go.etcd.io/etcd/server/v3"
