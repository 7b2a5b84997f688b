"""Stage `prepare_benchmarks`: one benchmark -> ``eval_data/<name>.jsonl`` and its gold audit.

    python -m pipeline.prepare_benchmarks --name NAME --spec BENCH_SPEC --out eval_data/NAME.jsonl \\
        --audit results/audit/NAME.json

BENCH_SPEC keys: ``kind`` (math500, aime24, amc23, minerva, olympiadbench, collegemath, qwen_jsonl, generated,
gsm8k, gsm_symbolic);
``hub_id``, ``config``, ``split``, ``revision``, ``cache_dir`` (override the kind's pinned Hub source; ``hub_id``
may be a local dataset directory); ``path`` (a local JSONL file in the kind's format instead of the Hub; required
for qwen_jsonl); ``subset_size``, ``subset_seed``, ``subset_ids_file`` (olympiadbench and collegemath default to
200 items); ``gold`` (clean | upstream: the gold as upstream's scorer saw it, pipeline.tasks.benchmarks); ``generated``
(ArithmeticSpec fields, for kind generated); ``templates`` (held_out | all, kind gsm8k: the GSM8K problems of the
held-out templates, or all 100) and ``gsm_symbolic`` ({count, seed}: variants of the held-out templates, kind
gsm_symbolic); both GSM kinds come from the installed package (pipeline.tasks.gsm, its template split).

Subsets: when ``subset_ids_file`` exists, exactly its ids are used (reproducible across data orderings);
otherwise ``subset_size`` items are drawn with ``random.Random(subset_seed)`` and, when ``subset_ids_file`` is
named, the drawn ids are recorded there for the next run. Rows that cannot be used (missing, empty or mistyped
fields) are skipped and listed in the audit, which also lists every gold that fails to verify against itself.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pipeline.core.io import InputError, atomic_write_json, load_spec, publish_jsonl, run_cli
from pipeline.models.hub_cache import dataset_commit
from pipeline.tasks import gsm
from pipeline.tasks.arith import arithmetic_problems
from pipeline.tasks.benchmark_spec import benchmark_spec
from pipeline.tasks.benchmarks import (
    DEFAULT_SUBSET_SEED,
    SOURCE_FORMATS,
    arithmetic_spec,
    check_file,
    gsm_symbolic_settings,
    items_with_ids,
    load_hub_rows,
    normalize_rows,
    read_subset_ids,
    select_subset,
    usable_rows,
)
from pipeline.tasks.gold_audit import audit_golds


def generated_items(name: str, spec: dict[str, Any]) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """Generated arithmetic problems (pipeline.tasks.arith) in the benchmark schema, ids prefixed by ``name``."""
    arithmetic = arithmetic_spec(spec.get("generated", {}), f"benchmarks.{name}.generated")
    items = [{**row, "source": "generated"} for row in arithmetic_problems(arithmetic, id_prefix=name)]
    return items, {"kind": "generated", "generated": asdict(arithmetic)}


def gsm_items(name: str, spec: dict[str, Any]) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """GSM8K originals (kind gsm8k) or seeded GSM-Symbolic variants (kind gsm_symbolic) of the package's templates."""
    provenance: dict[str, Any] = {"kind": spec["kind"], "package": gsm.package_version()}
    if spec["kind"] == "gsm8k":
        templates = spec.get("templates", "held_out")
        problems = gsm.originals(templates)
        provenance["templates"] = templates
    else:
        settings = gsm_symbolic_settings(spec.get("gsm_symbolic"), f"benchmarks.{name}.gsm_symbolic")
        problems = gsm.variants(settings["count"], settings["seed"], "held_out", name)
        provenance |= {"templates": "held_out", **settings}
    items = [{"id": p.id, "problem": p.question, "answer": p.answer, "source": spec["kind"]} for p in problems]
    return items, provenance


def source_items(name: str, spec: dict[str, Any]) -> tuple[list[dict[str, str]], list[dict[str, Any]], dict[str, Any]]:
    """Normalized items, skipped rows and the provenance of a Hub or local-file benchmark."""
    kind = spec["kind"]
    source = SOURCE_FORMATS[kind]
    gold_format = spec.get("gold", "clean")
    if "path" in spec:
        path = str(spec["path"])
        items, skipped = usable_rows(check_file(path, source, gold_format))
        provenance = {"kind": kind, "path": path, "rows": len(items) + len(skipped)}
    elif source.hub_id is None and "hub_id" not in spec:
        raise InputError(f"benchmarks.{name}: kind '{kind}' reads a local file: set 'path'")
    else:
        provenance = {
            "kind": kind,
            "hub_id": spec.get("hub_id", source.hub_id),
            "config": spec.get("config", source.config),
            "split": spec.get("split", source.split or "test"),
            "revision": str(spec.get("revision", source.revision or "main")),
        }
        rows = load_hub_rows(
            provenance["hub_id"],
            config=provenance["config"],
            split=provenance["split"],
            revision=provenance["revision"],
            cache_dir=spec.get("cache_dir"),
        )
        items, skipped = normalize_rows(rows, source, provenance["hub_id"], gold_format)
        provenance["rows"] = len(rows)
        provenance["commit"] = dataset_commit(provenance["hub_id"], provenance["revision"], spec.get("cache_dir"))
    return items, skipped, provenance | {"gold": gold_format}


def apply_subset(
    name: str, spec: dict[str, Any], items: list[dict[str, str]], provenance: dict[str, Any]
) -> tuple[list[dict[str, str]], dict[str, Any] | None]:
    """The benchmark's items after subsetting (module docstring), and a description of the subset (or None)."""
    kind = spec["kind"]
    default_size = SOURCE_FORMATS[kind].subset_size if kind in SOURCE_FORMATS else None
    size = spec.get("subset_size", default_size)
    seed = spec.get("subset_seed", DEFAULT_SUBSET_SEED)
    ids_file = Path(spec["subset_ids_file"]) if spec.get("subset_ids_file") else None
    if ids_file is not None and ids_file.is_file():
        chosen = items_with_ids(items, read_subset_ids(ids_file), ids_file)
        return chosen, {"mode": "recorded", "ids_file": str(ids_file), "size": len(chosen)}
    if size is None or size >= len(items):
        return items, None
    chosen = select_subset(items, size, seed)
    subset = {"mode": "drawn", "seed": seed, "size": size, "from_items": len(items)}
    if ids_file is not None:
        record = {"benchmark": name, "source": provenance, **subset, "ids": [item["id"] for item in chosen]}
        atomic_write_json(ids_file, record)
        subset["ids_file"] = str(ids_file)
    return chosen, subset


def prepare_benchmark(name: str, spec: Any) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """Items of benchmark ``name`` and its audit record (gold audit, skipped rows, source, subset)."""
    spec = benchmark_spec(spec, f"benchmarks.{name}")
    if spec["kind"] == "generated":
        (items, provenance), skipped = generated_items(name, spec), []
    elif spec["kind"] in ("gsm8k", "gsm_symbolic"):
        (items, provenance), skipped = gsm_items(name, spec), []
    else:
        items, skipped, provenance = source_items(name, spec)
    items, subset = apply_subset(name, spec, items, provenance)
    if not items:
        raise InputError(f"benchmarks.{name}: no usable items ({len(skipped)} rows skipped)")
    audit = audit_golds(name, items)
    audit |= {"skipped": skipped, "skipped_count": len(skipped), "source": provenance, "subset": subset}
    return items, audit


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", required=True, help="benchmark name (config key)")
    parser.add_argument("--spec", required=True, help="BENCH_SPEC: inline JSON or a JSON/YAML file")
    parser.add_argument("--out", required=True, help="output JSONL (id, problem, answer, source)")
    parser.add_argument("--audit", required=True, help="output gold-audit JSON")
    args = parser.parse_args(argv)
    items, audit = prepare_benchmark(args.name, load_spec(args.spec))
    publish_jsonl(args.out, items)
    atomic_write_json(args.audit, audit)


if __name__ == "__main__":
    run_cli(main)
