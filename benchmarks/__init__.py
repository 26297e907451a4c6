"""Benchmarks: scripts that print figures and ratios (never timed tests). Results go to docs/BENCHMARKS.md."""
