"""A full disk, named: an output that does not fit stops its stage with ``SAVE_FAILED_EXIT_CODE`` (73, a final
status: ``pipeline.core.exit_codes``) and one line naming the path, the space needed and the space free, instead of
a traceback that names neither and an exit 1 that Snakemake retries.

Every stage routes its large writes through ``output_space`` (a model directory, samples, training data, figures,
a checkpoint's export), and ``pipeline.core.io.run_cli`` turns the ``OutputSpaceError`` it raises, and any other
``ENOSPC`` that reaches it, into that status. A write fails for lack of space when the error is ``ENOSPC`` or
``EDQUOT`` (itself or anywhere in its chain of causes), or whatever the error when the filesystem has less free
space than the output needs: safetensors and ``torch.save`` report a full disk in errors of their own
("os error 28", "unexpected pos"), not as an ``OSError``.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

OUT_OF_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class OutputSpaceError(RuntimeError):
    """An output did not fit on the disk; the message names the path, the space needed and the space free."""


def gib(size: int) -> str:
    """``size`` bytes for a message: GiB with 3 decimals (and the bytes, for the small test models)."""
    return f"{size / 2**30:.3f} GiB ({size} bytes)"


def free_bytes(path: Path) -> int:
    """Free space, in bytes, of the filesystem that holds ``path`` (or would: its nearest existing ancestor)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def space_message(path: Path, needed: int, free: int, what: str) -> str:
    """The line that names a full disk: ``path``, what did not fit, the space it needs and the space free."""
    return f"{path}: not enough disk space for {what}: {gib(needed)} needed, {gib(free)} free"


def space_problem(path: Path, needed: int, free: int, what: str = "the checkpoint") -> str | None:
    """The error for ``needed`` bytes of ``what`` written into ``path`` with ``free`` bytes left; None if it fits."""
    return None if needed <= free else space_message(path, needed, free, what)


def is_out_of_space(error: BaseException | None) -> bool:
    """Whether ``error`` or an error in its chain (``__cause__``, ``__context__``) is ``ENOSPC`` or ``EDQUOT``."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in OUT_OF_SPACE_ERRNOS:
            return True
        error = error.__cause__ or error.__context__
    return False


@contextlib.contextmanager
def output_space(path: Path, needed: int | Callable[[], int], what: str) -> Iterator[None]:
    """Write ``what`` into ``path`` inside the block: a failure for lack of space (module docstring) becomes an
    ``OutputSpaceError`` naming ``path``, the space ``needed`` (bytes, or a function that estimates them, called
    only on failure) and the space free after the failure; any other error passes unchanged."""
    try:
        yield
    except OutputSpaceError:
        raise
    except Exception as error:
        free = free_bytes(path)
        size = needed() if callable(needed) else needed
        if not is_out_of_space(error) and size <= free:
            raise
        raise OutputSpaceError(f"{space_message(path, size, free, what)} ({type(error).__name__}: {error})") from error


def unnamed_space_error(error: OSError) -> OutputSpaceError:
    """The error for an ``ENOSPC`` raised outside ``output_space``: the file it names and the free space there (the
    space needed is not known, only that it is more than that), or, when it names none (a write to an open file),
    that it names none."""
    cause = f"({type(error).__name__}: {error})"
    if not error.filename:
        return OutputSpaceError(
            f"not enough disk space for an output of this stage, which the error does not name {cause}"
        )
    path = Path(error.filename)
    return OutputSpaceError(
        f"{path}: not enough disk space: more than the {gib(free_bytes(path))} free needed, how much more is not "
        f"known {cause}"
    )
