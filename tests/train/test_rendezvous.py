"""A run that no launcher started gets a rendezvous port of its own (pipeline.train.single_process_rendezvous):
TRL's colocated vLLM opens a one-process group on the first free port of a fixed list, so two such runs starting
together on one machine both took 29500 and one died with EADDRINUSE (seen with two weight-sync tests at once)."""

from __future__ import annotations

import socket

from pipeline.train import free_port, single_process_rendezvous


def test_an_unlaunched_run_takes_a_port_the_system_chose() -> None:
    assert single_process_rendezvous({}, pick_port=lambda: 41234) == {"MASTER_PORT": "41234"}
    assert single_process_rendezvous({"MASTER_PORT": ""}, pick_port=lambda: 41234) == {"MASTER_PORT": "41234"}


def test_a_launched_run_or_a_named_port_is_left_alone() -> None:
    assert single_process_rendezvous({"WORLD_SIZE": "1"}, pick_port=lambda: 41234) == {}
    assert single_process_rendezvous({"MASTER_PORT": "29511"}, pick_port=lambda: 41234) == {}


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", port))
    assert port != 29500
