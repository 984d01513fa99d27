"""AstraFlow launch component."""
