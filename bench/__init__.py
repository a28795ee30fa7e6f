"""Benchmarks: gpulens against raw Prometheus, measured as ratios in one run (`make bench`)."""
