"""Stage `token_analysis` (spec 8): where in the reasoning do GRAIL's weights go?

    python -m pipeline.token_analysis --model-dir DIR... --samples FILE --benchmark FILE --spec JSON --out-dir DIR

Per checkpoint: the positional profile of the weights over evaluated rollouts (``pipeline.evaluation.token_weights``,
which gives the bins and the U-shape index), written as JSON, and one figure of every checkpoint's profile.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.io import atomic_save_figure, atomic_write_json, load_spec, run_cli
from pipeline.core.specs import dataclass_from_mapping
from pipeline.evaluation.token_weights import TokenAnalysisSpec, add_checkpoint_arguments, analyse_checkpoint


def plot_profiles(summaries: dict[str, dict[str, Any]], path: Path) -> None:
    """Upstream's three panels: weight by position per checkpoint, correct vs wrong (last), heatmap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(summaries)
    figure, axes = plt.subplots(1, 3, figsize=(20, 5))
    colours = plt.cm.viridis(np.linspace(0.15, 0.9, max(len(labels), 1)))
    for label, colour in zip(labels, colours, strict=False):
        s = summaries[label]
        centres, mean, sem = (np.asarray(s[k], dtype=float) for k in ("bin_centres", "mean_weight", "sem_weight"))
        axes[0].plot(centres, mean, color=colour, label=label)
        axes[0].fill_between(centres, mean - sem, mean + sem, color=colour, alpha=0.12)
    last = summaries[labels[-1]]
    centres = np.asarray(last["bin_centres"])
    for group, colour in (("correct", "steelblue"), ("wrong", "tomato")):
        mean = np.asarray(last[f"mean_weight_{group}"], dtype=float)
        sem = np.asarray(last[f"sem_weight_{group}"], dtype=float)
        axes[1].plot(centres, mean, color=colour, label=f"{group} rollouts")
        axes[1].fill_between(centres, mean - sem, mean + sem, color=colour, alpha=0.15)
    for axis, title in ((axes[0], "Mean GRAIL weight by checkpoint"), (axes[1], f"Correct vs wrong ({labels[-1]})")):
        axis.axhline(1.0, linestyle="--", color="grey", label="uniform")
        axis.set(xlabel="normalized position in reasoning span", ylabel="mean GRAIL weight", title=title)
        axis.legend()
    heat = np.array([summaries[label]["mean_weight"] for label in labels], dtype=float)
    image = axes[2].imshow(
        heat, aspect="auto", cmap="RdBu_r", vmin=0.6, vmax=1.4, origin="lower", extent=(0, 1, -0.5, len(labels) - 0.5)
    )
    axes[2].set_yticks(range(len(labels)), labels)
    axes[2].set(xlabel="normalized position in reasoning span", title="Mean weight by bin")
    figure.colorbar(image, ax=axes[2], label="Mean GRAIL weight")
    figure.tight_layout()
    atomic_save_figure(figure, path, dpi=150)
    plt.close(figure)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.token_analysis", description=__doc__.splitlines()[0])
    add_checkpoint_arguments(parser, "--checkpoint", "analyse")
    parser.add_argument("--spec", default="{}", help="token-analysis settings (inline JSON or a YAML/JSON file)")
    parser.add_argument("--out-dir", required=True, type=Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spec = dataclass_from_mapping(TokenAnalysisSpec, load_spec(args.spec), "token_analysis spec")
    summaries = {
        label: analyse_checkpoint(model_dir, Path(samples), args.benchmark, spec)
        for label, model_dir, samples in args.checkpoint
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    plot_profiles(summaries, args.out_dir / "GRAIL_positional.png")
    atomic_write_json(args.out_dir / "summary.json", {"spec": spec.__dict__, "checkpoints": summaries})
    for label, summary in summaries.items():
        print(f"{label}: {summary['rollouts']} rollouts, U-shape index {summary['u_shape_index']:+.3f}")


if __name__ == "__main__":
    run_cli(main)
