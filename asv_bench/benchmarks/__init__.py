"""asv benchmarks for dxode (run from ``asv_bench/``: ``asv run -E existing:same``)."""
