"""Several nodes through c10d rendezvous (optbench.suite.distributed.torchrun_args), on one host:
two torchrun agents as two nodes of one gloo rank each, meeting at a free localhost port under one
rendezvous id, run the tiny config's DDP gradient check and timing in fp32. Both agents exit 0 and
the result says world size 2 from nodes 0 and 1 with the check passed; gradients left un-reduced
across the nodes (the 'no-sync' plant) fail both agents with the check refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from free_port import free_port
from test_distributed import CPU

from optbench.store.store import REPO_ROOT
from optbench.suite import distributed

TIMEOUT_S = 180.0


def _two_nodes(out: Path, plant: str) -> tuple[list[int], dict[str, Any] | None, str]:
    """Both agents' exit statuses, the result (written by global rank 0's node), their output."""
    endpoint, rdzv_id = f"127.0.0.1:{free_port()}", f"test-{uuid.uuid4().hex[:8]}"
    args = ("--size", "tiny", "--variant", "ddp", *CPU, "--plant", plant)
    agents = [
        subprocess.Popen(
            distributed.torchrun_command(
                1, out, *args, nnodes=2, node_rank=node, endpoint=endpoint, rdzv_id=rdzv_id
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO_ROOT,
            start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for node in (0, 1)
    ]
    try:
        outputs = [agent.communicate(timeout=TIMEOUT_S)[0] for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    tail = "\n".join(f"--- node {n} ---\n{o[-3000:]}" for n, o in enumerate(outputs))
    result = json.loads(out.read_text()) if out.exists() else None
    return [agent.returncode for agent in agents], result, tail


def test_arguments():
    assert distributed.torchrun_args(2) == ["--standalone", "--nproc-per-node=2"]
    assert distributed.torchrun_args(8, 2, 1, "10.0.0.1:29400", "run") == [
        "--nnodes=2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.1:29400",
        "--rdzv-id=run",
        "--rdzv-conf=is_host=0",
    ]
    assert distributed.torchrun_args(8, 2, 0, "10.0.0.1:29400")[-1] == "--rdzv-conf=is_host=1"
    with pytest.raises(ValueError):
        distributed.torchrun_args(1, 2, 0)
    with pytest.raises(ValueError):
        distributed.torchrun_args(1, 2, 2, "10.0.0.1:29400")


@pytest.mark.slow
def test_two_nodes_on_one_host(tmp_path):
    codes, result, tail = _two_nodes(tmp_path / "result.json", "none")
    assert codes == [0, 0] and result is not None, tail
    assert result["status"] == "ok" and result["world_size"] == 2 and result["backend"] == "gloo"
    check = result["check"]
    assert check["ok"] and check["global_batch"] == 2 * check["check_batch_per_rank"]
    ranks = sorted((r["rank"], r["node"], r["local_rank"]) for r in result["ranks"])
    assert ranks == [(0, 0, 0), (1, 1, 0)]


@pytest.mark.slow
def test_two_nodes_refuse_unreduced_gradients(tmp_path):
    """Mutation: each node keeps its own shard's gradient (DDP's no_sync): both agents fail, nothing
    timed."""
    codes, result, tail = _two_nodes(tmp_path / "result.json", "no-sync")
    assert 0 not in codes and result is not None, tail
    assert result["status"] == "wrong" and result["world_size"] == 2 and "ranks" not in result
    assert result["check"]["grad_error"] > 100 * result["check"]["tolerance"]
