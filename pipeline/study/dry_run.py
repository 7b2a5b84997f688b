"""The jobs of a dry run, read from Snakemake's own job records instead of the text `snakemake -n` prints.

    python -m pipeline.study.dry_run OUT.json SNAKEMAKE_ARGUMENTS...     # e.g. --profile P --configfile C -n

Snakemake's command line parses the arguments (so a profile applies exactly as for `snakemake --profile`), and the
dry run logs every planned job as a ``LogEvent.JOB_INFO`` record carrying the job itself: rule, wildcards, threads,
evaluated resources and outputs, the structured event Snakemake's logger plugins consume. A filter on Snakemake's
logger collects them (logger plugins are entry-point packages; a filter needs none) and OUT.json gets one object
per job. A resource Snakemake cannot evaluate before the job's inputs exist (its ``<TBD>`` placeholder, e.g.
``mem_mb`` of rule ``all`` under a profile's ``default-resources``) is written as null.

It runs in its own process: Snakemake changes the working directory (``--directory``) and the Snakefile sets signal
dispositions. Threads are left uncapped as on a cluster executor, where a job's threads become its
``--cpus-per-task``; a plain dry run would cap them at one core.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

UNCAPPED_CORES = 1 << 20  # `--cores` of the dry run: no job's threads reach it, as under a cluster executor


def job_record(record: logging.LogRecord) -> dict[str, Any]:
    """One JOB_INFO record as plain JSON: rule, wildcards, threads, resources (a placeholder as None), outputs."""
    from snakemake.common.tbdstring import TBDString

    resources = {
        name: None if isinstance(value, TBDString) or not isinstance(value, int | float | str) else value
        for name, value in record.resources.items()
    }
    return {
        "rule": record.rule_name,
        "wildcards": dict(record.wildcards or {}),
        "threads": record.threads,
        "resources": resources,
        "output": [str(path) for path in record.output or []],
    }


def planned_jobs(arguments: list[str]) -> tuple[bool, list[dict[str, Any]]]:
    """Run Snakemake's command line on ``arguments`` (a dry run) and collect its planned jobs: (success, jobs)."""
    from snakemake.cli import args_to_api, parse_args
    from snakemake.logging import LogEvent

    jobs: list[dict[str, Any]] = []

    class JobInfo(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if getattr(record, "event", None) == LogEvent.JOB_INFO:
                jobs.append(job_record(record))
            return True

    logging.getLogger("snakemake.logging").addFilter(JobInfo())
    parser, args = parse_args(arguments)
    if args.cores is None:
        args.cores = UNCAPPED_CORES
    return bool(args_to_api(args, parser)), jobs


def main(argv: list[str]) -> int:
    out, *arguments = argv
    success, jobs = planned_jobs(arguments)
    Path(out).write_text(json.dumps(jobs))
    return 0 if success else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
