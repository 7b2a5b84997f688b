"""The token-weight viewer: its choice of rollouts and colour scale, and its page opened in a real headless
Chromium (Debian's ``chromium`` + ``chromium-driver``, driven by selenium): token texts, colours, hover."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.io import InputError
from pipeline.credit.method import CreditInputs, CreditMethod, CreditResult
from pipeline.credit.methods.grpo import GrpoOptions
from pipeline.evaluation.offline_credit import centred_advantages, credit_methods
from pipeline.evaluation.token_weights import TokenAnalysisSpec, grouped_samples
from pipeline.models.tiny_model import TinyModelSpec, build_model, build_tokenizer, save_tiny_model
from pipeline.token_viewer import choose_rollouts, compute_views, opacity, render_page

REPO = Path(__file__).resolve().parents[2]
# A study's methods as the Snakefile passes them: two that weight tokens, the out-of-tree example
# (docs/examples/halfway.py, importable as examples.halfway with docs/ on the path) and GRPO, which does not.
METHODS = {
    "grail": {"credit": "grail", "grail_symmetry": "both"},
    "oar_g": {"credit": "oar_g"},
    "halfway": {"credit": "examples.halfway", "credit_options": {"late_weight": 3.0}},
    "grpo": {"credit": "grpo"},
}
WEIGHTED = ["grail", "oar_g", "halfway"]
PER_OUTCOME = 2
# Completions with HTML metacharacters, spaces before punctuation and line breaks, so that escaping and
# whitespace handling are exercised; each item has a correct and a wrong one (non-zero advantages).
COMPLETIONS = {
    True: "Add them: {a} + {b} = {s} .\nCheck <ok> & done, so \\boxed{{{s}}}",
    False: "Guess  {a}+{b} is {w} ; maybe\n\\boxed{{{w}}} (sure?)",
}


def test_centred_advantages_known_answer() -> None:
    assert centred_advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    assert centred_advantages([1.0, 1.0]) == [0.0, 0.0]


@given(st.lists(st.floats(0.01, 100.0), min_size=2, max_size=30))
def test_opacity_grows_with_the_weight(weights: list[float]) -> None:
    low, high = min(weights), max(weights)
    ordered = sorted(weights)
    alphas = [opacity(weight, low, high) for weight in ordered]
    assert alphas == sorted(alphas)
    assert all(0 < alpha <= 1 for alpha in alphas)


def samples_rows(items: int) -> tuple[list[dict], list[dict]]:
    benchmark, samples = [], []
    for index in range(items):
        a, b = index, index + 2
        benchmark.append({"id": f"q{index}", "problem": f"{a}+{b}=?", "answer": str(a + b), "source": "test"})
        for sample, correct in enumerate((True, False, index % 2 == 0)):
            text = COMPLETIONS[correct].format(a=a, b=b, s=a + b, w=a + b + 1)
            samples.append(
                {"id": f"q{index}", "sample": sample, "completion": text, "correct": correct, "num_tokens": len(text)}
            )
    return benchmark, samples


def test_choice_is_reproducible_balanced_and_prefers_mixed_groups() -> None:
    benchmark, samples = samples_rows(6)
    samples.append({"id": "q0", "sample": 9, "completion": "", "correct": False, "num_tokens": 0})
    problems = {row["id"]: row["problem"] for row in benchmark}
    groups = grouped_samples(samples, problems, Path("s.jsonl"))
    first = choose_rollouts(groups, problems, PER_OUTCOME, random.Random("0/x"))
    again = choose_rollouts(groups, problems, PER_OUTCOME, random.Random("0/x"))
    assert [(r.id, r.sample) for r in first] == [(r.id, r.sample) for r in again]
    assert [r.correct for r in first] == [True] * PER_OUTCOME + [False] * PER_OUTCOME
    assert all(r.advantage != 0 and r.completion for r in first)
    with pytest.raises(InputError, match=r"s\.jsonl:1: id 'q0' is not in the benchmark"):
        grouped_samples(samples, {}, Path("s.jsonl"))


def test_methods_are_built_from_the_registry_and_checked_by_name() -> None:
    methods = {"grail": {"credit": "grail", "grail_w_max": 3.0}, "entropy": {"credit": "high_entropy"}}
    weighting, others = credit_methods(methods, temperature=0.6, seed=4)
    assert list(weighting) == ["grail"] and others == ["entropy"]
    grail = weighting["grail"]
    assert grail.opts.grail_w_max == 3.0 and grail.opts.grail_w_min == 0.5  # the trainer config's default
    assert grail.args.temperature == 0.6 and grail.args.seed == 4
    with pytest.raises(InputError, match=r"methods: grail: unknown key\(s\) \['grail_wmax'\]"):
        credit_methods({"grail": {"credit": "grail", "grail_wmax": 3.0}}, 0.6, 0)
    with pytest.raises(InputError, match=r"credit grail: grail_w_max must be > 0, got -1"):
        credit_methods({"grail": {"credit": "grail", "grail_w_max": -1.0}}, 0.6, 0)
    with pytest.raises(InputError, match=r"credit must be one of .* cannot import 'graal'"):
        credit_methods({"g": {"credit": "graal"}}, 0.6, 0)


class HalfAdvantage(CreditMethod):
    """An additive per-token method: Â = A_i / 2 on every valid token, no weights."""

    name = "half_advantage"
    options = GrpoOptions
    needs_spans = False

    def advantages(self, inputs: CreditInputs) -> CreditResult:
        batch = inputs.batch
        return CreditResult(batch["advantages"][:, None] / 2 * batch["completion_mask"], None, {})


def test_a_method_without_weights_is_named_not_drawn() -> None:
    tokenizer = build_tokenizer()
    model = build_model(TinyModelSpec(seed=1), tokenizer).eval()
    built, _ = credit_methods({"grail": {"credit": "grail", "grail_symmetry": "both"}}, 0.6, 0)
    methods = {"grail": built["grail"], "half": HalfAdvantage(GrpoOptions(), built["grail"].args)}
    benchmark, samples = samples_rows(2)
    problems = {row["id"]: row["problem"] for row in benchmark}
    groups = grouped_samples(samples, problems, Path("s.jsonl"))
    rollouts = choose_rollouts(groups, problems, 1, random.Random(0))
    assert compute_views(model, tokenizer, rollouts, groups, TokenAnalysisSpec(), methods) == ["half"]
    assert all(list(rollout.weights) == ["grail"] and rollout.weights["grail"] for rollout in rollouts)
    page = render_page({"tiny": rollouts}, {"grail": {"credit": "grail"}, "half": {"credit": "x.half"}}, ["half"], 0)
    assert 'data-method="grail"' in page and 'data-method="half"' not in page
    assert "A<sub>i</sub> · w<sub>i,t</sub>): half." in page


def test_each_rollout_is_weighed_within_its_whole_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """A group method (the worked example, docs/examples/group_contrast.py) and a per-row one are computed on each
    shown rollout's item group, one group per batch: the viewer's weights are those of the group weighed alone,
    bit for bit, and the group method's vary (a batch of unrelated rollouts would give it weight 1 everywhere)."""
    monkeypatch.syspath_prepend(str(REPO / "docs"))
    tokenizer = build_tokenizer()
    model = build_model(TinyModelSpec(seed=1), tokenizer).eval()
    specs = {"contrast": {"credit": "examples.group_contrast"}, "grail": {"credit": "grail", "grail_symmetry": "both"}}
    methods, _ = credit_methods(specs, 0.6, 0)
    benchmark, samples = samples_rows(4)
    problems = {row["id"]: row["problem"] for row in benchmark}
    groups = grouped_samples(samples, problems, Path("s.jsonl"))
    rollouts = choose_rollouts(groups, problems, 2, random.Random(0))
    assert len({rollout.id for rollout in rollouts}) > 1  # rollouts of several items, shown together
    assert compute_views(model, tokenizer, rollouts, groups, TokenAnalysisSpec(), methods) == []
    for rollout in rollouts:
        alone = [r for r in choose_rollouts({rollout.id: groups[rollout.id]}, problems, 3, random.Random(0))]
        compute_views(model, tokenizer, alone, {rollout.id: groups[rollout.id]}, TokenAnalysisSpec(), methods)
        same = next(r for r in alone if r.sample == rollout.sample)
        assert same.weights == rollout.weights
        assert len(set(rollout.weights["contrast"])) > 1


@pytest.fixture(scope="module")
def viewer_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict], str]:
    """The stage run on the tiny model (two checkpoints), its stderr going to a file as in a job log."""
    root = tmp_path_factory.mktemp("viewer")
    model = save_tiny_model(TinyModelSpec(seed=1), root / "model")
    benchmark, samples = samples_rows(4)
    (root / "bench.jsonl").write_text("".join(json.dumps(row) + "\n" for row in benchmark))
    (root / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in samples))
    page = root / "token_weights.html"
    with open(root / "stage.log", "w") as log:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline.token_viewer",
                *("--rollouts", "tiny/grail/seed0/final", str(model), str(root / "samples.jsonl")),
                *("--rollouts", "tiny/grpo/seed0/final", str(model), str(root / "samples.jsonl")),
                *("--benchmark", str(root / "bench.jsonl")),
                *("--methods", json.dumps(METHODS)),
                *("--per-outcome", str(PER_OUTCOME), "--seed", "5", "--out", str(page)),
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'docs'}"},
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=600,
        )
    return page, samples, (root / "stage.log").read_text()


def test_stage_progress_is_readable_in_a_log_file(viewer_page) -> None:
    _, _, log = viewer_page
    assert "\r" not in log
    # the last refresh and the close may both print the finished bar when a checkpoint takes over the refresh
    # interval (a loaded machine)
    final = [line for line in log.splitlines() if line.startswith("token weights: 100%")]
    assert final and all(
        re.search(r"\| 2/2 \[\d\d:\d\d<00:00, +[\d.]+(s/checkpoint|checkpoint/s)\]$", line) for line in final
    ), log


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)
    driver.set_window_size(1400, 1000)
    yield driver
    driver.quit()


def alpha(css_colour: str) -> float:
    """The opacity of a computed ``rgba(r, g, b, a)`` colour (``rgb(...)`` is opaque)."""
    parts = re.findall(r"[\d.]+", css_colour)
    return float(parts[3]) if len(parts) == 4 else 1.0


def test_page_in_a_real_browser(viewer_page, browser) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    page, samples, _ = viewer_page
    completions = {(row["id"], row["sample"]): row["completion"] for row in samples}
    browser.get(page.as_uri())
    sections = browser.find_elements(By.CSS_SELECTOR, "section")
    assert [s.get_attribute("data-label") for s in sections] == ["tiny/grail/seed0/final", "tiny/grpo/seed0/final"]
    rollouts = browser.find_elements(By.CSS_SELECTOR, ".rollout")
    assert len(rollouts) == 2 * 2 * PER_OUTCOME
    orderings_checked = 0
    for rollout in rollouts:
        completion = completions[(rollout.get_attribute("data-id"), int(rollout.get_attribute("data-sample")))]
        rows = rollout.find_elements(By.CSS_SELECTOR, ".weights")
        assert [row.get_attribute("data-method") for row in rows] == WEIGHTED
        for row in rows:
            tokens = row.find_elements(By.CSS_SELECTOR, ".token")
            assert "".join(token.get_attribute("textContent") for token in tokens) == completion
            boxed = "".join(t.get_attribute("textContent") for t in tokens if "boxed" in t.get_attribute("class"))
            assert boxed.startswith("\\boxed{") and boxed.endswith("}") and boxed in completion
            shown = [
                (float(token.get_attribute("data-weight")), alpha(token.value_of_css_property("background-color")))
                for token in tokens
            ]
            by_weight = sorted(shown)
            assert [a for _, a in by_weight] == sorted(a for _, a in by_weight)  # colour intensity follows weight
            if by_weight[0][0] < by_weight[-1][0]:
                assert by_weight[0][1] < by_weight[-1][1]
                orderings_checked += 1
        grail_row, _, halfway_row = (row.find_elements(By.CSS_SELECTOR, ".token") for row in rows)
        content = [float(t.get_attribute("data-weight")) for t in grail_row if "boxed" in t.get_attribute("class")]
        assert content[len("\\boxed{")] == 5.0  # GRAIL's answer-content override (w_max), as the trainer applies
        late = [float(token.get_attribute("data-weight")) for token in halfway_row]
        assert late[0] == 1.0 and late[-1] == 3.0 and set(late) == {1.0, 3.0}  # the example's formula and option
    assert orderings_checked >= len(rollouts)  # every row had distinct weights, so the check was not vacuous

    token = rollouts[0].find_elements(By.CSS_SELECTOR, ".weights .token")[3]
    tooltip = browser.find_element(By.ID, "tooltip")
    assert not tooltip.is_displayed()
    ActionChains(browser).move_to_element(token).perform()
    assert tooltip.is_displayed()
    text = tooltip.text
    weights = json.loads(rollouts[0].get_attribute("data-weights"))
    assert list(weights) == WEIGHTED
    for method in WEIGHTED:
        assert f"{method} weight {weights[method][3]:g}" in text, (method, text)
    assert f"advantage {rollouts[0].get_attribute('data-advantage')}" in text
    first_row_weight = float(token.get_attribute("data-weight"))
    assert math.isclose(first_row_weight, weights["grail"][3], rel_tol=1e-5)
    intro = browser.find_element(By.TAG_NAME, "p").text
    assert "Methods that weight no tokens (TRL's sequence advantage, or per-token advantages" in intro
    assert "): grpo." in intro


def test_report_links_the_page_and_requires_it(tmp_path: Path) -> None:
    from tests.core.test_report import report_command, write_inputs

    config = write_inputs(tmp_path)
    (tmp_path / "token_weights.html").write_text("<!DOCTYPE html><html></html>")
    command = [*report_command(tmp_path, json.dumps(config), tmp_path / "tables"), "--token-viewer"]
    subprocess.run([*command, str(tmp_path / "token_weights.html")], check=True, capture_output=True, cwd=REPO)
    assert "## Token weights\n\n[Token weights](token_weights.html)" in (tmp_path / "report.md").read_text()
    missing = subprocess.run([*command, str(tmp_path / "nope.html")], capture_output=True, text=True, cwd=REPO)
    assert missing.returncode == 2 and "nope.html: report input not found" in missing.stderr
