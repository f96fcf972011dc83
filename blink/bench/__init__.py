"""Benchmarks: step and offline roofline runs, the serving load generator, attackers and the interference lab."""
