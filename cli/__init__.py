"""The ``astraflow`` command line (Typer). Heavy libraries are imported inside commands only."""
