"""Assembly of a running server: settings, metrics, HTTP endpoints, lifecycle."""
