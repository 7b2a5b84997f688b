"""high_entropy: the high-entropy-minority baseline is TRL's own ``top_entropy_quantile`` mask, set from the
method's option; its loss and gradients are TRL's GRPOTrainer's with that option, and differ without it."""

from __future__ import annotations

import pytest
import torch
from test_equivalence import ADVANTAGES, assert_same, loss_and_grads
from trainer_support import COMPLETIONS, boxed_batch, make_trainer

from pipeline.core.io import InputError


def test_high_entropy_is_trls_top_entropy_quantile(random_model_dir, tmp_path):
    ours = make_trainer(random_model_dir, tmp_path / "a", dtype=torch.float64, credit="high_entropy")
    assert ours.args.top_entropy_quantile == 0.2 and ours.top_entropy_quantile == 0.2
    trl = make_trainer(random_model_dir, tmp_path / "b", True, torch.float64, top_entropy_quantile=0.2)
    plain = make_trainer(random_model_dir, tmp_path / "c", True, torch.float64)
    batch = boxed_batch(ours.processing_class, COMPLETIONS, ADVANTAGES)
    expected = loss_and_grads(trl, batch)
    assert_same(loss_and_grads(ours, batch), expected)
    assert not torch.allclose(loss_and_grads(plain, batch)[0], expected[0])  # the mask changes the loss


def test_conflicting_trl_option_is_refused(random_model_dir, tmp_path):
    with pytest.raises(InputError, match=r"credit high_entropy: top_entropy_quantile is set to 0\.5"):
        make_trainer(random_model_dir, tmp_path, credit="high_entropy", top_entropy_quantile=0.5)
