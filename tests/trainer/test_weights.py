"""Fast GRAIL weights (shared loss forward, and the per-generation own forward) equal the reference path's
(upstream's separate pass), for every leaf and both positions; rows that cannot need saliency are skipped.

In float64: weights use log(s + 1e-8), which turns float32 rounding of near-zero scores into ~1e-3 differences.
"""

from __future__ import annotations

import pytest
import torch
from trainer_support import COMPLETIONS, boxed_batch, make_trainer

from pipeline.credit import answer_mask_from_spans, find_boxed_spans, saliency_scores

ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 2.0, 1.0]  # no zero: with symmetry "both" every boxed row needs saliency


@pytest.fixture(scope="module")
def trainer(random_model_dir, tmp_path_factory):
    grail = make_trainer(random_model_dir, tmp_path_factory.mktemp("out"), dtype=torch.float64, credit="grail")
    grail.model.train()
    return grail


@pytest.fixture(scope="module")
def batch(trainer):
    return boxed_batch(trainer.processing_class, COMPLETIONS, ADVANTAGES)


def grail_weights_of(trainer, batch, *, share: bool, keep_forward: bool = False, **options) -> torch.Tensor:
    """Weights of ``batch`` with the GRAIL options set on the shared trainer (fast path, symmetry "both" unless
    overridden); the memoised loss forward is dropped unless ``keep_forward``."""
    defaults = dict(
        grail_implementation="fast", grail_leaf="embeddings", grail_position="previous", grail_symmetry="both"
    )
    for name, value in {**defaults, **options}.items():
        setattr(trainer.args, name, value)
    weights = trainer._credit_weights(trainer.model, batch, share_loss_forward=share)
    if not keep_forward:
        trainer._memoised_forward = None
    return weights


@pytest.mark.parametrize("leaf", ["embeddings", "first", "middle", "last"])
@pytest.mark.parametrize("position", ["previous", "same"])
def test_fast_weights_equal_reference(trainer, batch, leaf, position):
    options = dict(grail_leaf=leaf, grail_position=position)
    reference = grail_weights_of(trainer, batch, share=False, grail_implementation="reference", **options)
    shared = grail_weights_of(trainer, batch, share=True, **options)
    own_forward = grail_weights_of(trainer, batch, share=False, **options)
    torch.testing.assert_close(shared, reference, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(own_forward, reference, rtol=1e-4, atol=1e-5)
    non_uniform = (reference != batch["completion_mask"]) & (reference != 5.0)
    assert non_uniform[0].any() and non_uniform[1].any()  # the saliency really shaped some weights


def test_fast_weights_with_gradient_checkpointing(trainer, batch):
    reference = grail_weights_of(trainer, batch, share=False, grail_implementation="reference")
    trainer.model.gradient_checkpointing_enable({"use_reentrant": False})
    try:
        checkpointed = grail_weights_of(trainer, batch, share=True)
    finally:
        trainer.model.gradient_checkpointing_disable()
    torch.testing.assert_close(checkpointed, reference, rtol=1e-4, atol=1e-5)


def test_leaves_are_distinct_activations(trainer, batch):
    """On the 4-layer model the four leaves give four different score tensors (so the test above has teeth)."""
    spans = find_boxed_spans(trainer.processing_class, batch["completion_ids"], batch["completion_mask"])
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    answer_mask = answer_mask_from_spans(spans, batch["completion_ids"].size(1))
    scores = [
        saliency_scores(trainer.model, input_ids, attention_mask, answer_mask, leaf=leaf)
        for leaf in ("embeddings", "first", "middle", "last")
    ]
    for index, first in enumerate(scores):
        for second in scores[index + 1 :]:
            assert not torch.allclose(first, second)


def test_skipped_rows_and_symmetry(random_model_dir, tmp_path, batch):
    """Under "wrong", positive-advantage rows are fallback (1, plus the boxed overrides) and get no saliency
    pass; zero-advantage rows keep the completion mask; the saliency row fraction counts the rest."""
    zero_advantage = {**batch, "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 1.0])}
    trainer = make_trainer(random_model_dir, tmp_path, credit="grail", grail_symmetry="wrong")
    trainer.model.train()
    weights = trainer._credit_weights(trainer.model, zero_advantage, share_loss_forward=True)
    mask = zero_advantage["completion_mask"].float()
    spans = find_boxed_spans(trainer.processing_class, batch["completion_ids"], batch["completion_mask"])
    _, content_start, end = spans[0].tolist()
    expected_row0 = mask[0].clone()
    expected_row0[content_start : end - 1] = 5.0
    torch.testing.assert_close(weights[0], expected_row0)  # A > 0: fallback, content x5
    torch.testing.assert_close(weights[4], mask[4])  # A = 0: irrelevant to the loss, left at the mask
    torch.testing.assert_close(weights[2], mask[2])  # no box: fallback
    assert trainer._metrics["train"]["grail/saliency_rows_frac"] == [pytest.approx(2 / 6)]  # rows 1 and 3


def test_several_processes_make_one_forward_whatever_their_rows_need(trainer, batch, monkeypatch):
    """Under DDP every forward is a collective (buffers are broadcast first): with two processes, a rank whose rows
    split into needing / not needing saliency must still make exactly one forward, or the other rank waits forever
    (found in a two-process SmolLM2 run). One forward of all rows gives the same weights and the same loss forward."""
    from trl import GRPOTrainer

    mixed = {**batch, "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 1.0], dtype=torch.float64)}
    forwards: list[int] = []
    original = GRPOTrainer._get_per_token_logps_and_entropies

    def counted(self, model, input_ids, *args, **kwargs):
        forwards.append(input_ids.size(0))
        return original(self, model, input_ids, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", counted)

    def weights_and_forward() -> tuple[torch.Tensor, tuple]:
        forwards.clear()
        weights = grail_weights_of(trainer, mixed, share=True, grail_symmetry="wrong", keep_forward=True)
        memoised, trainer._memoised_forward = trainer._memoised_forward, None
        return weights, memoised

    one_process, one_process_forward = weights_and_forward()
    assert forwards == [2, 4]  # rows 1 and 3 need saliency (negative advantage, boxed); the rest in a second chunk
    monkeypatch.setattr(type(trainer.accelerator), "num_processes", property(lambda self: 2))
    two_processes, two_processes_forward = weights_and_forward()
    assert forwards == [6]
    torch.testing.assert_close(two_processes, one_process)
    for shared, split in zip(two_processes_forward[:2], one_process_forward[:2], strict=True):
        torch.testing.assert_close(shared, split)
