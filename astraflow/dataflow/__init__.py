"""AstraFlow dataflow component."""
