"""GRAIL reproduction pipeline: credit-assignment math, TRL trainer and the Snakemake stages."""

from pipeline.core import distributions, kernels, orphans

__version__ = "0.1.0"
# First: the parent a stage started under, before its imports of seconds (a wrapper killed meanwhile is caught).
orphans.remember_parent()
# Before any stage imports torch: its kernel path, MKL's and oneDNN's are read once, at initialisation.
kernels.apply()
# Before transformers and TRL are imported: each scans every installed distribution (pipeline/core/distributions.py).
distributions.scan_distributions_once()
