"""AstraFlow trainer component."""
