"""Measurements that print tables; nothing here passes or fails on a time. Run all with ``python -m benchmarks``."""
