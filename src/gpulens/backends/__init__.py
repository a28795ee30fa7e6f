"""Metrics backends: run planned range queries against a TSDB."""
