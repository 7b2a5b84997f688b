"""One training run: TRL's GRPO trainer with token-level credit, its config, resumable state and fingerprints, the
NaN guard and live tracking."""
