"""From change events to pushes: debounce, the push context snapshot, the push queue."""
