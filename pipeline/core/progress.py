"""Progress bars that read well both on a terminal and in a job log that is a file (Slurm, Snakemake's ``log:``).

On a terminal this is plain tqdm. Written to a file, tqdm's carriage-return redraws pile up on one unreadable line;
here every refresh becomes its own line instead, at most one every ``FILE_REFRESH_SECONDS`` (plus the first and the
last), each with items done / total, elapsed and time left, and the rate:

    evaluate batches:  40%|####      | 4/10 [00:12<00:18,  3.01s/batch]
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import IO, Any, TypeVar

from tqdm import tqdm

# Seconds between two lines in a log file: often enough to see a long stage move, rare enough to keep logs short.
FILE_REFRESH_SECONDS = 30.0
FILE_BAR_COLUMNS = 100

Item = TypeVar("Item")


class LineStream:
    """A text stream for tqdm that turns each carriage-return redraw into one line of ``target``."""

    def __init__(self, target: IO[str]) -> None:
        self.target = target

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()  # tqdm pads a redraw with spaces to erase the longer previous one
        if line:
            self.target.write(line + "\n")

    def flush(self) -> None:
        self.target.flush()


def progress(
    iterable: Iterable[Item] | None = None, *, desc: str, unit: str = "it", total: int | None = None, **options: Any
) -> tqdm:
    """A tqdm bar on stderr; when stderr is not a terminal, one line per refresh (module docstring)."""
    stream = sys.stderr
    if not stream.isatty():
        options = {
            "file": LineStream(stream),
            "mininterval": FILE_REFRESH_SECONDS,
            "ncols": FILE_BAR_COLUMNS,
            "ascii": True,
            **options,
        }
    return tqdm(iterable, desc=desc, unit=unit, total=total, **options)
