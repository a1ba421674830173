"""Benchmarks for DESIGN.md §7; run them with ``make bench`` (``python -m benchmarks``)."""
