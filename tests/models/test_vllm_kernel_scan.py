"""vLLM's CPU start-up scans every module's globals (``_rebind_kernels``); after a Snakemake workflow was loaded in
the same process, one of them (Snakemake's storage registry) fails that scan unless ``globals_vllm_can_scan`` hides
it. This ended a CI run: the vLLM engine test ran in a pytest worker after tests that plan a study in-process."""

from __future__ import annotations

import sys

import pytest

from pipeline.models.vllm_cpu import globals_vllm_can_scan
from tests.snakemake_in_process import load_a_snakemake_workflow

pytestmark = pytest.mark.vllm


def test_vllm_kernel_scan_survives_a_snakemake_workflow_loaded_in_process(tmp_path):
    pytest.importorskip("vllm")
    from vllm.triton_utils.dispatcher import _rebind_kernels

    load_a_snakemake_workflow(tmp_path)
    with pytest.raises(AttributeError, match="StorageProviderProxy"):
        _rebind_kernels([])  # the scan as vLLM runs it on this process, unguarded
    registry = vars(sys.modules["snakemake.workflow"])["storage"]
    with globals_vllm_can_scan() as hidden:
        assert hidden == ["snakemake.workflow.storage"]
        _rebind_kernels([])
    assert vars(sys.modules["snakemake.workflow"])["storage"] is registry
