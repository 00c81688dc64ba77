"""Benchmarks: the fleet simulator, scenarios and the runner (see docs/benchmarks.md)."""
