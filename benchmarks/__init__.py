"""The workloads of docs/benchmarks.md; run them with ``make bench`` (``python -m benchmarks``)."""
