"""AstraFlow models component."""
