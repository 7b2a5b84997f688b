"""Live tracking through transformers' ``report_to``: a real training run of the GRAIL trainer with TensorBoard and
W&B (offline) on, read back with TensorBoard's own reader and from the W&B run file; no credential leaks."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from train_support import REPO_ROOT, TRAINING_SPEC, subprocess_env, train_command
from wandb_records import history_rows, read_records

from pipeline.core.io import InputError
from pipeline.core.repo import SCHEMA_PATH
from pipeline.training.tracking import TrackingConfig, load_tracking, wandb_run_id

FAKE_KEY = "wandbFAKEkey0123456789abcdef0123456789ab"
RUN_NAME = "tiny/grail/seed3"
WATCHED_KEYS = ("reward", "grail/weight_mean", "grail/fallback_rate", "loss")


def test_tracking_config_matches_the_schema() -> None:
    """The `tracking` section is declared twice (schema for the Snakefile, dataclass for the code): same keys and
    defaults."""
    schema = yaml.safe_load(SCHEMA_PATH.read_text())["$defs"]["tracking"]["properties"]
    defaults = TrackingConfig()
    assert set(schema) == set(TrackingConfig.__dataclass_fields__)
    assert {name: spec["default"] for name, spec in schema.items()} == defaults.__dict__


def test_tracking_spec_is_checked_by_name() -> None:
    assert load_tracking('{"report_to": ["tensorboard", "wandb"]}').integrations() == ["tensorboard", "wandb"]
    assert load_tracking("{}").integrations() == []
    with pytest.raises(InputError, match=r"--tracking: report_to: unknown integration\(s\) \['mlflow'\]"):
        load_tracking('{"report_to": "mlflow"}')
    with pytest.raises(InputError, match=r"--tracking: .*'projekt'"):
        load_tracking('{"projekt": "x"}')


def test_wandb_run_id_is_stable_and_valid() -> None:
    first = wandb_run_id("paper", "Qwen3-4B/grail/seed0")
    assert first == wandb_run_id("paper", "Qwen3-4B/grail/seed0") != wandb_run_id("paper", "Qwen3-4B/grail/seed1")
    assert set(first) <= set("abcdefghijklmnopqrstuvwxyz0123456789_-")


@pytest.fixture(scope="module")
def tracked_run(model_dir: Path, train_jsonl: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("tracked")
    tracking = {"report_to": ["tensorboard", "wandb"], "project": "grail-test", "study": "unit"}
    command = train_command(
        model_dir,
        train_jsonl,
        root / "run",
        "--tracking",
        json.dumps(tracking),
        "--run-name",
        RUN_NAME,
        "--tracking-dir",
        str(root / "tracking"),
        training_spec={**TRAINING_SPEC, "max_steps": 3, "num_iterations": 1},
        method_spec={"credit": "grail", "grail_std": 0.5},
    )
    wandb_home = {name: str(root / "wandb_home" / name) for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR")}
    env = {**subprocess_env(), "WANDB_MODE": "offline", "WANDB_API_KEY": FAKE_KEY, **wandb_home}
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    return root, metrics, result


def logged_steps(metrics: list[dict], key: str) -> list[int]:
    return [row["step"] for row in metrics if key in row]


def test_tensorboard_events_hold_the_logged_keys_and_steps(tracked_run) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, metrics, _ = tracked_run
    events = EventAccumulator(str(root / "tracking" / "tensorboard" / RUN_NAME))
    events.Reload()
    for key in WATCHED_KEYS:
        scalars = events.Scalars(f"train/{key}")
        assert logged_steps(metrics, key), key  # logged at least once (GRAIL's only on steps with mixed rewards)
        assert [event.step for event in scalars] == logged_steps(metrics, key), key
        expected = [row[key] for row in metrics if key in row]
        assert [event.value for event in scalars] == pytest.approx(expected, rel=1e-6), key


def test_offline_wandb_run_holds_the_logged_keys_and_steps(tracked_run) -> None:
    root, metrics, _ = tracked_run
    (run_file,) = (root / "tracking" / "wandb").glob("offline-run-*/run-*.wandb")
    (run,) = [record.run for record in read_records(run_file) if record.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.run_group, run.project) == (RUN_NAME, "unit", "grail-test")
    assert run.run_id == wandb_run_id("unit", RUN_NAME)
    rows = history_rows(run_file)
    assert logged_steps(metrics, "reward") == [1, 2, 3]
    for key in WATCHED_KEYS:
        logged = [
            (int(json.loads(row["train/global_step"])), json.loads(row[f"train/{key}"]))
            for row in rows
            if f"train/{key}" in row
        ]
        expected = [(row["step"], row[key]) for row in metrics if key in row]
        assert [step for step, _ in logged] == [step for step, _ in expected], key
        assert [value for _, value in logged] == pytest.approx([value for _, value in expected], rel=1e-6), key


def test_no_credential_reaches_any_tracker_file_or_output(tracked_run) -> None:
    root, _, result = tracked_run
    written = [path for path in root.rglob("*") if path.is_file()]
    assert any(path.suffix == ".wandb" for path in written)
    assert [path for path in written if FAKE_KEY.encode() in path.read_bytes()] == []
    assert FAKE_KEY not in result.stdout + result.stderr


def test_training_progress_is_one_line_per_update_when_logged_to_a_file(tracked_run) -> None:
    """stderr is a pipe here, as in a job log: the step bar prints whole lines (steps done / total, time left)."""
    _, _, result = tracked_run
    bars = [line for line in result.stderr.split("\n") if line.startswith("train: ")]
    assert bars[0].startswith("train:   0%") and not any("\r" in line for line in bars), result.stderr[-3000:]
    assert re.match(r"train: 100%\|#+\| 3/3 \[\d\d:\d\d<00:00, +[\d.]+(s/step|step/s)\]$", bars[-1]), bars
