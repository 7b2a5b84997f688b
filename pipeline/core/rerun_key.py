"""The key of what a rerun gives back instead of recomputing: the digest of the rule's rerun params.

Snakemake reruns a job when one of its params changes (the code digest, the library versions, the kernel path,
the settings: ``--rerun-triggers params``), and deletes the job's outputs before it runs it. A stage that keeps
an output to give it back on such a rerun (the evaluate rules' kept samples, pipeline.evaluation.sampling) must
not give it back across a change of any of those params: that is an output made by other code or settings. So a
rule declares its rerun params once, as a mapping; the Snakefile hands the mapping to Snakemake as params, with
their key beside them (``with_rerun_key``), and passes the key to the stage, which keys what it keeps with it. The two come from one list and
cannot drift: a param that reruns the job changes the key.

    key = RERUN_KEY_TAG + SHA-256 of the canonical JSON of {name: value}, each value as Snakemake evaluates it

The key is itself one of the job's params (Snakemake formats the command from params), derived from the others:
the tag marks it, so that ``python -m pipeline.why_rerun`` does not count it as a setting of its own (a reviewed
code change that changes it can still be accepted).

No third-party imports: the Snakefile imports this module.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

RERUN_KEY_TAG = "rerun-key "
RerunParam = str | int | Callable[[Any], str | int]  # a constant, or a function of the job's wildcards


def rerun_key(values: Mapping[str, Any]) -> str:
    """``RERUN_KEY_TAG`` + SHA-256 (hex) of the canonical JSON of ``values`` (a job's evaluated rerun params)."""
    canonical = json.dumps(dict(values), sort_keys=True, separators=(",", ":"))
    return RERUN_KEY_TAG + hashlib.sha256(canonical.encode()).hexdigest()


def is_rerun_key(value: Any) -> bool:
    """Whether a recorded param value is a rerun key (derived from the job's other params)."""
    return isinstance(value, str) and value.startswith(RERUN_KEY_TAG)


def with_rerun_key(params: Mapping[str, RerunParam]) -> dict[str, RerunParam]:
    """A rule's rerun ``params`` and, beside them, ``rerun_key``: their key (``rerun_key_param``)."""
    return {**params, "rerun_key": rerun_key_param(params)}


def rerun_key_param(params: Mapping[str, RerunParam]) -> Callable[[Any], str]:
    """A Snakemake param (a function of the job's wildcards): ``rerun_key`` of ``params``, each evaluated for the
    job as Snakemake evaluates it (a function of the wildcards, or a constant)."""

    def key(wildcards: Any) -> str:
        return rerun_key({name: value(wildcards) if callable(value) else value for name, value in params.items()})

    return key
