"""Benchmarks: each writes JSON and prints a short table."""
