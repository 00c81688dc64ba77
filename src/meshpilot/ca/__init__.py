"""The mesh's certificate authority: its signing keys and the workload certificates it issues."""
