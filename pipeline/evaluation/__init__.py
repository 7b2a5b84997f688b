"""Sampling a model and reading what it wrote: the evaluation spec, the resumable sampling loop, its transformers and
vLLM backends, and the token-weight analysis of sampled rollouts."""
