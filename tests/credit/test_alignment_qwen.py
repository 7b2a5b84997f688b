"""Answer-span alignment on the real Qwen2.5/Qwen3 vocabulary: where upstream's re-encode-and-count mapping and
the exact character cover pick different answer, content and boundary tokens.

Token lists are what the Qwen BPE produces (``Ġ`` is a leading space); each case names the merge that moves
upstream's span: ``{\\``, ``{-``, ``{x`` and ``{(`` are single tokens, and the space or `` $`` before ``\\boxed``
merges with the backslash, which upstream's separate encoding of the prefix cannot see.
"""

from __future__ import annotations

import pytest
import torch

from pipeline.credit import find_boxed_spans, span_masks

# (completion, which box, {alignment: (answer tokens, content tokens)})
CASES = {
    "fraction": (
        "The answer is \\boxed{\\frac{1}{2}}.",
        "first",
        {
            "exact": (["Ġ\\", "boxed", "{\\", "frac", "{", "1", "}{", "2", "}}"], ["{\\", "frac", "{", "1", "}{", "2"]),
            # the space merged into "Ġ\\" is counted as its own token: the whole span moves right by one
            "upstream": (["boxed", "{\\", "frac", "{", "1", "}{", "2", "}}", "."], ["{", "1", "}{", "2", "}}"]),
        },
    ),
    "negative": (
        "so \\boxed{-3} done",
        "first",
        {
            "exact": (["Ġ\\", "boxed", "{-", "3", "}"], ["{-", "3"]),
            # same span, but "{-" is counted as marker: the sign is boundary (weight 1), not content (w_max)
            "upstream": (["Ġ\\", "boxed", "{-", "3", "}"], ["3"]),
        },
    ),
    "dollar": (
        "thus $\\boxed{x}$.",
        "first",
        {
            "exact": (["Ġ$\\", "boxed", "{x", "}"], ["{x"]),
            # " $\\" is one token: the span moves right by one and the content is empty
            "upstream": (["boxed", "{x", "}", "$."], []),
        },
    ),
    "two boxes, first": (
        "first \\boxed{1} and \\boxed{(2,3)}.",
        "first",
        {
            "exact": (["Ġ\\", "boxed", "{", "1", "}"], ["1"]),
            "upstream": (["boxed", "{", "1", "}", "Ġand"], ["}"]),
        },
    ),
    "two boxes, last": (
        "first \\boxed{1} and \\boxed{(2,3)}.",
        "last",
        {
            "exact": (["Ġ\\", "boxed", "{(", "2", ",", "3", ")}."], ["{(", "2", ",", "3"]),
            "upstream": (["boxed", "{(", "2", ",", "3", ")}."], [",", "3"]),
        },
    ),
}


def masked_tokens(tokenizer, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    return tokenizer.convert_ids_to_tokens(ids[mask].tolist())


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("alignment", ["exact", "upstream"])
def test_answer_and_content_tokens(qwen_tokenizer, case, alignment):
    text, which, expected = CASES[case]
    ids = torch.tensor([qwen_tokenizer.encode(text)])
    spans = find_boxed_spans(qwen_tokenizer, ids, torch.ones_like(ids), which=which, alignment=alignment)
    masks = span_masks(spans, ids.shape[1])
    answer, content = expected[alignment]
    assert masked_tokens(qwen_tokenizer, ids[0], masks.answer[0]) == answer
    assert masked_tokens(qwen_tokenizer, ids[0], masks.content[0]) == content
    # boundary = answer minus content, always the marker tokens and the last answer token
    boundary = masked_tokens(qwen_tokenizer, ids[0], masks.boundary[0])
    assert boundary == [
        token for token, inside in zip(answer, _content_flags(answer, content), strict=True) if not inside
    ]


def _content_flags(answer: list[str], content: list[str]) -> list[bool]:
    """Which answer tokens are content: content is a contiguous run that ends one before the last token."""
    start = len(answer) - 1 - len(content)
    return [start <= index < len(answer) - 1 for index in range(len(answer))]


def test_modes_agree_when_no_token_crosses_the_box_edges(qwen_tokenizer):
    text = "Answer:\n\\boxed{12}\n"
    ids = torch.tensor([qwen_tokenizer.encode(text)])
    exact, upstream = (
        find_boxed_spans(qwen_tokenizer, ids, torch.ones_like(ids), alignment=alignment)
        for alignment in ("exact", "upstream")
    )
    assert torch.equal(exact, upstream)


def test_right_padding_and_a_row_without_a_box(qwen_tokenizer):
    rows = [qwen_tokenizer.encode("so \\boxed{-3} done"), qwen_tokenizer.encode("no box")]
    width = max(map(len, rows))
    pad = qwen_tokenizer.pad_token_id
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    spans = find_boxed_spans(qwen_tokenizer, ids, mask, alignment="upstream")
    assert spans.tolist() == [[1, 4, 6], [-1, -1, -1]]


def test_unknown_alignment_is_refused(qwen_tokenizer):
    ids = torch.tensor([qwen_tokenizer.encode("\\boxed{1}")])
    with pytest.raises(ValueError, match="alignment must be one of"):
        find_boxed_spans(qwen_tokenizer, ids, torch.ones_like(ids), alignment="approximate")
