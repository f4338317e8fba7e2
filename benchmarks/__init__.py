"""attnswitch's benchmark suite; run it with ``python -m benchmarks``."""
