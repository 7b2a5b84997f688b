"""answer_only: GRAIL's answer override alone (known answers on small inputs)."""

from __future__ import annotations

import torch

from pipeline.credit.methods.answer_only import answer_only_weights


def test_boxed_content_gets_the_answer_weight_and_everything_else_one():
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0, 0]])
    spans = torch.tensor([[2, 4, 7], [-1, -1, -1]])  # row 0: \boxed{ at 2-3, content 4-5, } at 6, post 7
    expected = torch.tensor([[1, 1, 1, 1, 3, 3, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0, 0]], dtype=torch.float32)
    torch.testing.assert_close(answer_only_weights(mask, spans, 3.0), expected)


def test_empty_content_changes_nothing():
    mask = torch.ones(1, 5, dtype=torch.long)
    spans = torch.tensor([[1, 3, 4]])  # "\boxed{}": no content token
    torch.testing.assert_close(answer_only_weights(mask, spans, 5.0), torch.ones(1, 5))
