"""Command-line entry points (typer)."""
