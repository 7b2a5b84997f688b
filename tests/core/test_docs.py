"""The documentation the code points at exists and stays true: every "spec N.M" citation names a section of
docs/spec.md; docs/output.md "Logged metrics" lists every metric the trainer adds to TRL's; docs/parameters.md is
the page configs/schema.yaml generates; README.md stays a short entry point whose two commands come first and whose
links resolve."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch

from pipeline.credit import grail_weights_with_stats
from pipeline.credit.oar_g import oar_g_stats
from pipeline.study.schema import load_schema
from pipeline.training.trainer_metrics import log_advantage_metrics, log_nanmeans, log_percentiles
from tools import docs_parameters

REPO = Path(__file__).resolve().parents[2]
CITATION = re.compile(r"\b[Ss]pec (?:sections? )?(\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?")
SOURCES = [
    *REPO.glob("pipeline/**/*.py"),
    *REPO.glob("tests/**/*.py"),
    *REPO.glob("configs/*.yaml"),
    REPO / "Snakefile",
    REPO / "README.md",
    REPO / "ARCHITECTURE.md",
    *REPO.glob("docs/*.md"),
]


def spec_sections() -> set[str]:
    headings = re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", (REPO / "docs" / "spec.md").read_text(), re.MULTILINE)
    return set(headings)


def test_every_spec_citation_names_a_section_of_docs_spec():
    sections = spec_sections()
    missing = [
        f"{path.relative_to(REPO)}: spec {number}"
        for path in SOURCES
        for match in CITATION.finditer(path.read_text(encoding="utf-8"))
        for number in match.groups()
        if number is not None and number not in sections
    ]
    assert missing == []


def logged_credit_metrics() -> set[str]:
    """Every name the trainer's credit logging produces, from the real functions on a small batch."""
    accelerator = SimpleNamespace(
        device="cpu", gather=lambda tensor: tensor, pad_across_processes=lambda tensor, **_: tensor
    )
    lists: defaultdict[str, list[float]] = defaultdict(list)
    mask = torch.ones(2, 6)
    spans = torch.tensor([[1, 2, 4], [-1, -1, -1]])
    _, grail_stats = grail_weights_with_stats(torch.rand(2, 6), mask, torch.tensor([1.0, -1.0]), spans)
    answer = torch.tensor([True, False])
    for prefix, stats in (("grail", grail_stats), ("oar_g", oar_g_stats(mask, mask, ~answer, answer))):
        log_nanmeans(accelerator, lists, prefix, {**stats, "saliency_rows_frac": 0.5})
        log_advantage_metrics(accelerator, lists, prefix, torch.ones(2), torch.ones(2, 6), mask)
    log_percentiles(accelerator, lists, "grail/grad_norm", torch.rand(2))
    return set(lists)


def test_output_page_lists_every_logged_credit_metric():
    page = (REPO / "docs" / "output.md").read_text()
    section = page.split("## Logged metrics", 1)[1].split("\n## ", 1)[0]
    unlisted = [
        name
        for name in sorted(logged_credit_metrics())
        if f"`{name}`" not in section and f"`<credit>/{name.split('/', 1)[1]}`" not in section
    ]
    assert unlisted == []


def test_parameters_page_is_the_one_the_schema_generates():
    """Fails when configs/schema.yaml changed and `python -m tools.docs_parameters` was not rerun."""
    page = (REPO / "docs" / "parameters.md").read_text(encoding="utf-8")
    assert page == docs_parameters.render(load_schema()), "docs/parameters.md is stale: python -m tools.docs_parameters"


def test_parameters_page_has_every_schema_key_and_description():
    schema = load_schema()
    page = docs_parameters.render(schema)
    assert "| `evaluation.vllm.gpu_memory_utilization` | number or null (&gt; 0, &lt;= 1) | `null` |" in page
    assert "| `methods.<name>.grail_symmetry` | `both` \\| `all` \\| `correct` \\| `wrong` |" in page
    assert "| `resources.default.cpus` | integer (&gt;= 1) | `1` | Snakemake threads |" in page
    assert schema["$defs"]["tracking"]["properties"]["study"]["description"] in page


README_COMMANDS = """```bash
# 1. install, then run the whole default study (tiny model x {GRPO, GRAIL, OAR-G} x 2 seeds, CPU, minutes)
bash scripts/install.sh && snakemake --cores 2

# 2. install with the test tooling, then run the test suite (starts a local Slurm for the cluster tests)
bash scripts/install.sh --dev --vllm && bash scripts/test.sh
```"""


def test_readme_is_short_and_starts_with_the_two_commands():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    assert readme.index("```") == readme.index(README_COMMANDS)


def test_readme_links_resolve():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    targets = [target.split("#", 1)[0] for target in re.findall(r"\]\(([^)#][^)]*)\)", readme)]
    missing = [target for target in targets if "://" not in target and not (REPO / target).exists()]
    assert targets
    assert missing == []
