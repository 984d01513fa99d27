"""AstraFlow weights component."""
