"""A study's numbers: per-sample metrics, score tables, variance components, paired and seed-aware tests, and the
words the report uses for them."""
