"""Per-sample evaluation rows for the stats tests (schema of ARCHITECTURE.md)."""

from __future__ import annotations


def sample_rows(correct: dict[str, list[bool]], extracted_when_wrong: str | None = None) -> list[dict]:
    """One row per (item, sample j): tokens 10 (j + 1); correct samples extract "1", wrong ones ``extracted_when_wrong``."""
    return [
        {
            "id": item,
            "sample": j,
            "completion": "",
            "extracted": "1" if ok else extracted_when_wrong,
            "correct": ok,
            "num_tokens": 10 * (j + 1),
        }
        for item, flags in correct.items()
        for j, ok in enumerate(flags)
    ]
