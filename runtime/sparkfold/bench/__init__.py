"""Benchmarks: load generators and reports; each compares against a baseline measured in the same run."""
