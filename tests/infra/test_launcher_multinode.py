"""Multi-node launch: one torchrun per node, node 0 hosting the rendezvous. Two "nodes" on 127.0.0.1 (two
torchrun agents with node ranks 0 and 1, one process each) form one gloo process group of world size 2."""

from __future__ import annotations

import json
import threading

import pytest

from infra.launcher import build_launch_command, free_port, run_command

PROBE = """
import json, os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
x = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(x)
out = {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": x.item(),
       "group_rank": int(os.environ["GROUP_RANK"]), "local_rank": int(os.environ["LOCAL_RANK"])}
open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w").write(json.dumps(out))
dist.destroy_process_group()
"""


def test_multinode_commands():
    node1 = build_launch_command(
        "m",
        ["--x"],
        launcher="torchrun",
        nproc=8,
        nnodes=4,
        node_rank=1,
        master_addr="10.0.0.5",
        master_port=29500,
    )
    assert node1.argv[3:8] == [
        "--nproc_per_node=8",
        "--nnodes=4",
        "--node_rank=1",
        "--master_addr=10.0.0.5",
        "--master_port=29500",
    ]
    assert node1.env["MASTER_ADDR"] == "10.0.0.5" and node1.env["MASTER_PORT"] == "29500"
    with pytest.raises(ValueError, match="torchrun"):
        build_launch_command("m", [], launcher="deepspeed", nproc=8, nnodes=2, master_port=29500)
    with pytest.raises(ValueError, match="node_rank 2"):
        build_launch_command("m", [], launcher="torchrun", nnodes=2, node_rank=2, master_port=29500)
    with pytest.raises(ValueError, match="master_port"):  # a free port per node would never meet
        build_launch_command("m", [], launcher="torchrun", nnodes=2, node_rank=0)


def test_two_nodes_form_one_process_group(tmp_path):
    (tmp_path / "allreduce_probe.py").write_text(PROBE)
    port = free_port()
    commands = [
        build_launch_command(
            "allreduce_probe",
            [str(tmp_path)],
            launcher="torchrun",
            nproc=1,
            nnodes=2,
            node_rank=rank,
            master_addr="127.0.0.1",
            master_port=port,
            threads_per_process=1,
            cwd=tmp_path,  # `-m allreduce_probe` resolves from the working directory
        )
        for rank in (0, 1)
    ]
    errors: list[BaseException] = []

    def node(rank: int) -> None:
        try:
            run_command(commands[rank], log_path=tmp_path / f"node{rank}.log", timeout_s=120)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert not errors, errors
    results = sorted(
        (json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")), key=lambda r: r["rank"]
    )
    assert results == [
        {"rank": 0, "world": 2, "sum": 3.0, "group_rank": 0, "local_rank": 0},
        {"rank": 1, "world": 2, "sum": 3.0, "group_rank": 1, "local_rank": 0},
    ]
