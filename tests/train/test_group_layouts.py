"""A group credit method sees every group whole, whatever the batch layout: one generation batch of 16 rollouts (4
prompts x 4) trained as 16 rows per device in one step, as 4 rows per device over 4 accumulation steps, and as 8
rows per device on two processes. tests/train/group_probe.py records each call of docs/examples/group_contrast.py's
method: it is called once per generation batch with all 16 rows (not per micro-step with a shuffled quarter of them),
the first two layouts hand it the same rollouts and get the same advantages bit for bit, both processes of the third
hand it the same gathered batch, in TRL's order (its advantages are TRL's group normalisation of its rewards), and the
advantages that reach TRL's loss are the method's.

Broken on purpose: with the trainer calling the method on each process's own rows (no gather), the two-process
layout's calls held 8 rows (2 groups) and the two processes different rollouts, and both of its tests failed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from test_train_run import REWARD
from train_support import REPO_ROOT, TRAINING_SPEC, launch_two, run_train, train_command

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
ON_PATH = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "docs"), str(HERE), str(REPO_ROOT / "tests" / "hold_stage")])
GROUP_SIZE = 4
LAYOUTS = {  # per device, accumulation steps, processes: 16 rollouts per generation batch each
    "one_step": (16, 1, 1),
    "accumulated": (4, 4, 1),
    "two_processes": (8, 1, 2),
}


def train_in_layout(name: str, model_dir: Path, data: Path, root: Path) -> tuple[Path, Path]:
    """One optimizer step of the recording method in layout ``name``: (run directory, records directory)."""
    per_device, accumulation, processes = LAYOUTS[name]
    spec = {
        **TRAINING_SPEC,
        "max_steps": 1,
        "save_steps": 1,
        "num_iterations": 1,
        "num_generations": GROUP_SIZE,
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": accumulation,
    }
    run_dir, records = root / name / "run", root / name / "records"
    command = train_command(model_dir, data, run_dir, training_spec=spec, method_spec={"credit": "group_probe"})
    hooks = {**REWARD, "PYTHONPATH": ON_PATH, "GROUP_PROBE_DIR": str(records)}
    result = run_train(launch_two(command) if processes == 2 else command, hooks)
    assert result.returncode == 0, result.stderr[-4000:]
    return run_dir, records


def calls(records: Path, rank: int = 0) -> list[dict]:
    return [torch.load(path, weights_only=True) for path in sorted(records.glob(f"call*-rank{rank}.pt"))]


def trl_group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """TRL's advantages of ``scale_rewards="group"``: (r - mean_g) / (std_g + 1e-4), 0 where r is NaN."""
    grouped = rewards.view(-1, GROUP_SIZE)
    mean = grouped.nanmean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)
    return torch.nan_to_num(((grouped - mean) / (std + 1e-4)).view(-1), nan=0.0)


@pytest.fixture(scope="module")
def layouts(model_dir, train_jsonl, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("layouts")
    return {name: train_in_layout(name, model_dir, train_jsonl, root) for name in LAYOUTS}


def test_each_layout_calls_the_method_once_with_every_group_whole(layouts) -> None:
    for name, (_, records) in layouts.items():
        processes = LAYOUTS[name][2]
        for rank in range(processes):
            (call,) = calls(records, rank)  # one generation batch, one call
            assert call["group_ids"].tolist() == [row // GROUP_SIZE for row in range(16)], name
            assert call["completion_ids"].size(0) == 16 and call["result"].shape == call["completion_ids"].shape


def test_one_step_and_accumulation_give_the_method_the_same_rollouts_and_it_the_same_advantages(layouts) -> None:
    (one,), (accumulated,) = calls(layouts["one_step"][1]), calls(layouts["accumulated"][1])
    assert one.keys() == accumulated.keys()
    for key, value in one.items():
        assert torch.equal(torch.as_tensor(value), torch.as_tensor(accumulated[key])), key
    assert one["advantages"].abs().sum() > 0  # the pseudo-random reward leaves groups with something to learn


def test_two_processes_hand_the_method_one_gathered_batch_in_trls_order(layouts) -> None:
    (rank0,), (rank1,) = (calls(layouts["two_processes"][1], rank) for rank in (0, 1))
    for key, value in rank0.items():
        assert torch.equal(torch.as_tensor(value), torch.as_tensor(rank1[key])), key
    assert torch.allclose(rank0["advantages"], trl_group_advantages(rank0["rewards"]), atol=1e-6)


def test_the_token_statistics_a_group_method_asks_for_are_the_gathered_batchs(layouts) -> None:
    """Log-probs and entropies of every row of the batch, on the valid tokens (0 on padding, finite, log p <= 0);
    the first two layouts' are the same bit for bit (compared with the other inputs above)."""
    for name, (_, records) in layouts.items():
        (call,) = calls(records)
        valid = call["completion_mask"].bool()
        for key in ("logps", "entropies"):
            assert call[key].shape == call["completion_ids"].shape, (name, key)
            assert torch.isfinite(call[key]).all() and not call[key][~valid].any(), (name, key)
        assert (call["logps"][valid] <= 0).all() and (call["entropies"][valid] >= 0).all(), name


def test_the_methods_advantages_reach_the_loss(layouts) -> None:
    """One micro-step holds the whole batch in the first layout: the loss's logged mean |Â| over valid tokens is
    that of the method's advantages."""
    run_dir, records = layouts["one_step"]
    (call,) = calls(records)
    mask = call["completion_mask"].float()
    expected = ((call["result"] * mask).abs().sum() / mask.sum()).item()
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").open() if '"loss"' in line]
    assert row["group_probe/advantages_weighted_abs_mean"] == pytest.approx(expected, rel=1e-5)


def test_ktae_trains_through_the_group_path(model_dir, train_jsonl, tmp_path) -> None:
    """The built-in group method, in the accumulation layout, on the real reward (KTAE splits a group by r > 0: the
    pseudo-random reward is positive everywhere): it trains, and some of its groups hold both outcomes, so tokens
    get keys."""
    per_device, accumulation, _ = LAYOUTS["accumulated"]
    spec = {**TRAINING_SPEC, "max_steps": 1, "save_steps": 1, "num_iterations": 1, "num_generations": GROUP_SIZE}
    spec |= {"per_device_train_batch_size": per_device, "gradient_accumulation_steps": accumulation}
    run_dir = tmp_path / "run"
    command = train_command(model_dir, train_jsonl, run_dir, training_spec=spec, method_spec={"credit": "ktae"})
    result = run_train(command)
    assert result.returncode == 0, result.stderr[-4000:]
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").open() if '"loss"' in line]
    assert 0 < row["ktae/keyed_token_frac"] <= 1 and row["ktae/key_abs_mean"] > 0, row
