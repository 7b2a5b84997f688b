"""GrailGRPOConfig: upstream defaults, the "all" alias, and validation errors that name the field."""

from __future__ import annotations

import pytest

from pipeline.core.io import InputError
from pipeline.training.grpo_config import GrailGRPOConfig


def config(tmp_path, **overrides) -> GrailGRPOConfig:
    return GrailGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **overrides)


def test_defaults_are_upstream_settings(tmp_path):
    args = config(tmp_path)
    assert (args.credit, args.grail_recompute, args.grail_implementation) == ("grpo", "every_step", "fast")
    assert (args.grail_mean, args.grail_std, args.grail_w_min, args.grail_w_max) == (1.0, 0.5, 0.5, 5.0)
    assert (args.grail_symmetry, args.grail_leaf, args.grail_position, args.answer_span) == (
        "both",
        "embeddings",
        "previous",
        "first",
    )
    assert (args.oar_g_tau, args.oar_g_beta, args.oar_g_eps, args.oar_g_noise_std) == (0.4, 2.0, 1e-12, 1e-3)
    # clean or upstream-GRAIL behaviour unless a config asks for a fidelity option (docs/fidelity.md)
    assert (args.oar_g_variant, args.answer_alignment, args.reward_grading) == ("upstream", "exact", "clean")
    assert args.vllm_rollout_seed == "run"


def test_all_is_an_alias_of_both(tmp_path):
    assert config(tmp_path, grail_symmetry="all").grail_symmetry == "both"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("credit", "ppo"),
        ("grail_symmetry", "positive"),
        ("grail_leaf", "output"),
        ("grail_position", "next"),
        ("answer_span", "middle"),
        ("grail_recompute", "never"),
        ("grail_implementation", "slow"),
        ("grail_std", 0.0),
        ("grail_w_min", -0.1),
        ("grail_w_max", 0.1),
        ("oar_g_tau", 1.0),
        ("oar_g_beta", -1.0),
        ("oar_g_eps", 0.0),
        ("oar_g_noise_std", -1e-3),
        ("oar_g_variant", "paper"),
        ("answer_alignment", "approximate"),
        ("reward_grading", "lenient"),
        ("vllm_rollout_seed", "global"),
    ],
)
def test_invalid_values_are_refused_by_name(tmp_path, field, value):
    with pytest.raises(InputError, match=field):
        config(tmp_path, **{field: value})


def test_every_oar_g_variant_has_a_weight_function():
    from pipeline.credit import OAR_G_VARIANTS
    from pipeline.training.grpo_config import credit_choices

    assert set(OAR_G_VARIANTS) == set(credit_choices()["oar_g_variant"])


@pytest.mark.parametrize(
    ("credit", "owner"), [("grail", "grail"), ("grail_shuffled", "grail_shuffled"), ("grpo", "grail")]
)
def test_an_option_error_names_the_configured_method_when_it_owns_the_option(tmp_path, credit, owner):
    """grail_shuffled shares GRAIL's options: its error names it, not GRAIL (nor, for another credit, the later
    of the two in the registry)."""
    with pytest.raises(InputError, match=rf"^credit {owner}: grail_w_max must be > 0, got -1\.0$"):
        config(tmp_path, credit=credit, grail_w_max=-1.0)
