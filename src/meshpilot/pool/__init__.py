"""The push-worker pool: worker processes that share the xDS ports and serve replicas of the main
process's model, kept in step by an ordered log of its changes (``docs/architecture.md``)."""
