"""The study numbers quoted in the README and the docs, generated from recorded runs rather than typed in.

    python -m tools.docs_numbers --record default results      # docs/numbers/default.json from a finished study
    python -m tools.docs_numbers                               # rewrite every generated block
    python -m tools.docs_numbers --check                       # exit 1 when a block is stale

A recorded summary (``docs/numbers/<study>.json``) keeps what a finished study's tables, significance tests,
training logs and provenance say, and what made them: the commit, the date, the kernel path and CPU of every run
and evaluation, the library versions, and the digest of the reference guard's numbers (``summary.REFERENCE``, the
CI study's numbers; its header, which says where it was made, is left out). A test holds both ends: every generated
block equals what ``render`` makes from the summaries, and every summary was recorded under the reference's
numbers as they are now. When a change moves the numbers, the reference is regenerated, that test fails, and the
studies are run and recorded again (docs/contributing.md, "Numbers").

The modules: ``summary`` (the summary's format: where summaries live, how one is read, when one is stale),
``record`` (a finished study -> its summary), ``render`` (summaries -> the pages' generated blocks) and
``__main__`` (the command line).
"""
