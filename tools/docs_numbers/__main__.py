"""The study numbers quoted in the README and the docs, generated from recorded runs: the command line (the
package's docstring says the rest).

    python -m tools.docs_numbers --record default results      # docs/numbers/default.json from a finished study
    python -m tools.docs_numbers                               # rewrite every generated block
    python -m tools.docs_numbers --check                       # exit 1 when a block is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.core.io import atomic_write_json, atomic_write_text, run_cli
from pipeline.core.provenance import code_version
from pipeline.core.repo import REPO_DIR
from tools.docs_numbers.record import record
from tools.docs_numbers.render import PAGES, render_page, stale_pages
from tools.docs_numbers.summary import NUMBERS_DIR, load_studies


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.docs_numbers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", nargs=2, metavar=("STUDY", "RESULTS_DIR"), help="record a finished study")
    parser.add_argument(
        "--same-as", nargs="*", type=Path, default=[], help="with --record: other runs of it, checked bit for bit"
    )
    parser.add_argument("--commit", default=None, help="with --record: the commit it ran (default: the checkout's)")
    parser.add_argument("--config", default=None, help="with --record: the config it ran (default configs/STUDY.yaml)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated block is stale")
    args = parser.parse_args(argv)
    if args.record:
        study, results_dir = args.record
        summary = record(
            study,
            Path(results_dir),
            args.config or f"configs/{study}.yaml",
            args.same_as,
            args.commit or code_version().label(short=True),
        )
        atomic_write_json(NUMBERS_DIR / f"{study}.json", summary)
        print(f"recorded {NUMBERS_DIR / f'{study}.json'}")
    studies = load_studies()
    if args.check:
        stale = stale_pages(studies)
        if stale:
            print(f"stale numbers in {', '.join(stale)}: python -m tools.docs_numbers", file=sys.stderr)
            raise SystemExit(1)
        return
    for page in PAGES:
        path = REPO_DIR / page
        atomic_write_text(path, render_page(path.read_text(), studies, page))


if __name__ == "__main__":
    run_cli(main)
