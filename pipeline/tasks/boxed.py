"""The boxed answer: finding ``\\boxed{...}`` in text (plain string scanning, no grading, no third-party imports)."""

from __future__ import annotations

from typing import Literal, get_args

BOX_MARKER = "\\boxed{"
ExtractionMode = Literal["clean", "upstream"]
EXTRACTION_MODES: tuple[str, ...] = get_args(ExtractionMode)


def closing_braces(text: str) -> dict[int, int]:
    """Index of the matching ``}`` for every ``{`` of ``text`` that is closed (one stack pass, linear time).

    The match of ``{`` at ``p`` is the first ``q > p`` where the brace depth counted from ``p`` returns to 0,
    which is what a forward depth count from ``p`` finds; stray ``}`` with nothing open are ignored.
    """
    matches: dict[int, int] = {}
    open_positions: list[int] = []
    for index, character in enumerate(text):
        if character == "{":
            open_positions.append(index)
        elif character == "}" and open_positions:
            matches[open_positions.pop()] = index
    return matches


def boxed_contents(text: str, stop_at_unclosed: bool = False) -> list[tuple[int, int]]:
    """Character spans ``(content_start, content_end)`` of every complete, non-overlapping ``\\boxed{...}``.

    Braces are balanced by depth counting. An occurrence whose braces never close is skipped and the scan
    continues after its marker (as the training reward's recursive regex does), or, with ``stop_at_unclosed``,
    ends the scan (upstream's evaluation extractor). Linear in ``len(text)``.
    """
    if BOX_MARKER not in text:
        return []
    matches = closing_braces(text)
    spans: list[tuple[int, int]] = []
    position = 0
    while (start := text.find(BOX_MARKER, position)) != -1:
        content_start = start + len(BOX_MARKER)
        close = matches.get(content_start - 1)
        if close is None:
            if stop_at_unclosed:
                break
            position = content_start
        else:
            spans.append((content_start, close))
            position = close + 1
    return spans


def last_boxed(text: str, extraction: ExtractionMode = "clean") -> str | None:
    """Content of the last complete ``\\boxed{...}`` of ``text``, or None.

    ``clean``: unclosed boxes are skipped, the content is stripped. ``upstream`` (upstream's evaluation
    extractor, spec 6.2): the scan stops at the first unclosed box and the content is kept as written.
    """
    if extraction not in EXTRACTION_MODES:
        raise ValueError(f"extraction must be one of {EXTRACTION_MODES}, got {extraction!r}")
    spans = boxed_contents(text, stop_at_unclosed=extraction == "upstream")
    if not spans:
        return None
    start, end = spans[-1]
    return text[start:end] if extraction == "upstream" else text[start:end].strip()
