"""Token spans of a completion's ``\\boxed{...}`` answer, and the masks GRAIL derives from them (spec 1.3, 1.7).

A span is ``(start, content_start, end)`` in completion-token indices:

    start          first token of the ``\\boxed{`` marker
    content_start  first token of the content (the token holding the first character after ``\\boxed{``)
    end            one past the token holding the closing ``}``

so the answer is ``[start, end)``, the boundary is ``[start, content_start) ∪ {end - 1}``, the content is
``[content_start, end - 1)`` and the post-answer part is ``[end, T)``. ``(-1, -1, -1)`` marks a row without a
complete box. Characters map to tokens exactly, through the decoded prefixes of the row's own ids (the offset
mapping of the ids as sampled: re-encoding the text could tokenize it differently), so non-canonical
tokenizations and tokens that merge across the box's edges are handled: a span is the minimal token cover of the
box text (``decode(ids[start:end])`` contains it, and equals it when no token straddles its edges). A token
straddling the marker and the content counts as content; one straddling the content and the closing brace
counts as the closing brace (boundary); a character split over several byte tokens belongs to all of them.

Alignment ``upstream`` instead reproduces upstream GRAIL's counting (spec 1.3, 1.7): with
encode_mid(s) = encode("a" + s) minus the tokens of "a",

    start = |encode_mid(text[:box])|,  end = min(start + |encode_mid(box text)|, T),
    content_start = min(start + |encode_mid("\\boxed{")|, end)

which differs from the exact cover wherever a token merges across the box's edges: Qwen's ``{\\``, ``{-``, ``{(``
and ``{x`` are single tokens, so upstream counts the token that opens the content as marker (boundary), and a
`` $\\`` merge before ``\\boxed`` shifts its whole span by a token.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple, get_args

from pipeline.core.deferred import DeferredModule
from pipeline.tasks.boxed import BOX_MARKER, boxed_contents

if TYPE_CHECKING:
    import torch
else:  # torch at first use: planning loads the credit methods without it (pipeline.core.deferred)
    torch = DeferredModule("torch")

AnswerSpan = Literal["first", "last"]  # which complete box is the answer
ANSWER_SPANS: tuple[str, ...] = get_args(AnswerSpan)
AnswerAlignment = Literal["exact", "upstream"]  # how the box's characters map to tokens (module docstring)
ANSWER_ALIGNMENTS: tuple[str, ...] = get_args(AnswerAlignment)
DUMMY_PREFIX = "a"  # upstream's prefix that puts re-encoded text mid-sequence


class SpanMasks(NamedTuple):
    """Boolean (B, T) masks of spec 1.7; all False on rows without a span."""

    answer: torch.Tensor
    boundary: torch.Tensor
    content: torch.Tensor
    post: torch.Tensor


class _DecodedPrefixEnds(Sequence[int]):
    """``ends[k]`` = number of characters of ``text`` begun by the decoded ids ``ids[:k + 1]``.

    Non-decreasing in k, so ``bisect_right(ends, c)`` is the first token that holds (a byte of) character c. A
    prefix that cuts a character (partial UTF-8 bytes decode to U+FFFD) has begun the character it cuts.
    """

    def __init__(self, tokenizer, ids: list[int], text: str) -> None:
        self.tokenizer, self.ids, self.text = tokenizer, ids, text

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, k: int) -> int:
        prefix = _decode(self.tokenizer, self.ids[: k + 1])
        if self.text.startswith(prefix):
            return len(prefix)
        pairs = enumerate(zip(prefix, self.text, strict=False))
        return next((i for i, (a, b) in pairs if a != b), len(self.text)) + 1


def _decode(tokenizer, ids: list[int]) -> str:
    # Upstream decodes with skip_special_tokens (drops EOS and padding); no clean-up, so prefixes stay prefixes.
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _box_chars(text: str, which: str) -> tuple[int, int, int] | None:
    """Character (marker start, content start, one past the closing brace) of the chosen complete box."""
    boxes = boxed_contents(text)
    if not boxes:
        return None
    content_start, content_end = boxes[0] if which == "first" else boxes[-1]
    return content_start - len(BOX_MARKER), content_start, content_end + 1


def _row_span(tokenizer, ids: list[int], which: str) -> tuple[int, int, int] | None:
    """Span of one row's valid ids, as indices into ``ids``, or None."""
    text = _decode(tokenizer, ids)
    chars = _box_chars(text, which)
    if chars is None:
        return None
    marker_char, content_char, end_char = chars
    ends = _DecodedPrefixEnds(tokenizer, ids, text)
    start = bisect.bisect_right(ends, marker_char)
    content_start = bisect.bisect_right(ends, content_char, lo=start)
    last = bisect.bisect_right(ends, end_char - 1, lo=content_start)
    return start, content_start, last + 1


def _mid_sequence_length(tokenizer, text: str, dummy_length: int) -> int:
    """|encode_mid(text)|: tokens of ``"a" + text`` after the tokens of ``"a"`` (upstream's dummy-prefix count)."""
    return max(len(tokenizer.encode(DUMMY_PREFIX + text, add_special_tokens=False)) - dummy_length, 0)


def _upstream_row_span(tokenizer, ids: list[int], which: str) -> tuple[int, int, int] | None:
    """Span of one row's valid ids by upstream's re-encode-and-count mapping (module docstring), or None."""
    text = _decode(tokenizer, ids)
    chars = _box_chars(text, which)
    if chars is None:
        return None
    marker_char, _, end_char = chars
    dummy_length = len(tokenizer.encode(DUMMY_PREFIX, add_special_tokens=False))
    start = _mid_sequence_length(tokenizer, text[:marker_char], dummy_length)
    end = min(start + _mid_sequence_length(tokenizer, text[marker_char:end_char], dummy_length), len(ids))
    if start >= end:
        return None
    content_start = min(start + _mid_sequence_length(tokenizer, BOX_MARKER, dummy_length), end)
    return start, content_start, end


ROW_SPANS = {"exact": _row_span, "upstream": _upstream_row_span}


def find_boxed_spans(
    tokenizer,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    which: AnswerSpan = "first",
    alignment: AnswerAlignment = "exact",
) -> torch.Tensor:
    """(B, 3) long tensor of ``(start, content_start, end)`` per row (see the module docstring).

    Only positions with ``completion_mask == 1`` are read (a truncated row, all zeros, has no span). ``which``:
    "first" complete box (upstream GRAIL and OAR-G) or "last" (the one the reward grades). Braces are matched as
    upstream does: an occurrence of ``\\boxed{`` whose braces never balance is skipped. ``alignment``: "exact"
    character-to-token cover, or "upstream" re-encode-and-count (module docstring).
    """
    if which not in ANSWER_SPANS:
        raise ValueError(f"which must be one of {ANSWER_SPANS}, got {which!r}")
    if alignment not in ANSWER_ALIGNMENTS:
        raise ValueError(f"alignment must be one of {ANSWER_ALIGNMENTS}, got {alignment!r}")
    spans = torch.full((completion_ids.shape[0], 3), -1, dtype=torch.long)
    for row, (ids, mask) in enumerate(zip(completion_ids.tolist(), completion_mask.tolist(), strict=True)):
        positions = [t for t, valid in enumerate(mask) if valid]
        span = ROW_SPANS[alignment](tokenizer, [ids[t] for t in positions], which)
        if span is not None:
            start, content_start, end = span
            # one past the last valid position maps to one past its tensor position (an empty content)
            ends = [*positions, positions[end - 1] + 1]
            spans[row] = torch.tensor([positions[start], ends[content_start], positions[end - 1] + 1])
    return spans.to(completion_ids.device)


def span_masks(spans: torch.Tensor, T: int) -> SpanMasks:
    """Answer ``[start, end)``, boundary ``[start, content_start) ∪ {end-1}``, content ``[content_start, end-1)``
    and post ``[end, T)`` masks, (B, T) bool, from (B, 3) spans."""
    t = torch.arange(T, device=spans.device)[None, :]
    start, content_start, end = (spans[:, k : k + 1] for k in range(3))
    found = start >= 0
    answer = found & (t >= start) & (t < end)
    boundary = found & (((t >= start) & (t < content_start)) | (t == end - 1))
    content = found & (t >= content_start) & (t < end - 1)
    post = found & (t >= end)
    return SpanMasks(answer, boundary, content, post)


def answer_mask_from_spans(spans: torch.Tensor, T: int) -> torch.Tensor:
    """(B, T) bool: True on ``[start, end)`` of each row's span (the tokens of the answer loss, spec 1.3)."""
    return span_masks(spans, T).answer
