"""GRAIL reproduction pipeline: credit-assignment math, TRL trainer and the Snakemake stages."""

from pipeline.core import kernels

__version__ = "0.1.0"
# Before any stage imports torch: its kernel path, MKL's and oneDNN's are read once, at initialisation.
kernels.apply()
