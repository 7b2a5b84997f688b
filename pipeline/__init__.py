"""GRAIL reproduction pipeline: credit-assignment math, TRL trainer and the Snakemake stages."""

__version__ = "0.1.0"
