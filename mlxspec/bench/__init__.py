"""Benchmarks: every drafting mode on held-out prompts, plots, and the function-preserving widening."""
