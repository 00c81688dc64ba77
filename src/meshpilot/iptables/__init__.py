"""Traffic capture for sidecars: istio-iptables' rules, built as pure functions and applied by a runner."""
