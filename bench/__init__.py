"""Benchmarks of gpu-fence: the policy in process, the webhook over HTTPS, and the auditor cycle.

Each ``*_bench`` module runs as ``python -m bench.<name>``, prints a markdown table and, with ``--json FILE``,
writes its figures for ``BENCHMARKS.md``. Timings live here and never in tests: ``tests/bench/`` only checks that
each benchmark runs at a tiny size and reports well-formed results.
"""
