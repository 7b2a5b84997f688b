"""The control methods in the trainer, against GRAIL's weights or TRL's loss on the same prepared batch."""

from __future__ import annotations

import torch
from trainer_support import COMPLETIONS, boxed_batch, make_trainer

from pipeline.credit.methods.grail_shuffled import reasoning_mask

ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 2.0, 1.0]


def test_grail_shuffled_permutes_grails_reasoning_weights(random_model_dir, tmp_path):
    """Per row the same multiset of weights on the reasoning tokens as GRAIL's, at other places; the answer
    override (content w_max, markers) and the padding exactly GRAIL's."""
    grail = make_trainer(random_model_dir, tmp_path / "g", dtype=torch.float64, credit="grail")
    shuffled = make_trainer(random_model_dir, tmp_path / "s", dtype=torch.float64, credit="grail_shuffled")
    batch = boxed_batch(grail.processing_class, COMPLETIONS, ADVANTAGES)
    expected = grail._credit_weights(grail.model.train(), batch, share_loss_forward=False)
    got = shuffled._credit_weights(shuffled.model.train(), batch, share_loss_forward=False)
    reasoning = reasoning_mask(batch["completion_mask"], grail._answer_spans(batch))
    torch.testing.assert_close(got[~reasoning], expected[~reasoning])
    for row in range(len(ADVANTAGES)):
        torch.testing.assert_close(got[row, reasoning[row]].sort().values, expected[row, reasoning[row]].sort().values)
    assert not torch.equal(got[reasoning], expected[reasoning])
