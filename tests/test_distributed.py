"""Multi-process training steps (optbench.suite.distributed) on the CPU: 2 gloo ranks under
torchrun, the tiny config in fp32. The launch works, the gradient check passes for DDP and FSDP2 and
refuses planted bugs (a skipped all-reduce, a loss scaled by the world size), the result holds every
rank's timing, and the asv case stores the slowest rank's timing as its figure with the scaling
efficiency against 1 rank."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from free_port import free_port

from optbench.run.runner import Case, measure_case
from optbench.suite import distributed

CPU = (
    "--device",
    "cpu",
    "--precision",
    "fp32",
    "--warmup-ms",
    "0",
    "--rep-ms",
    "20",
    "--min-reps",
    "3",
)


def _run(variant: str, plant: str = "none", world: int = 2, extra: tuple[str, ...] = CPU):
    return distributed.launch(
        world, "--size", "tiny", "--variant", variant, *extra, "--plant", plant, timeout_s=240
    )


# DDP around the master-weight AdamW (Triton, interpreted on a CPU; bf16 weights, so bf16
# autocast): the optimizer of best-kernels, reading DDP's reduced gradients.
MASTER = (*CPU[:2], "--precision", "bf16", *CPU[4:], "--step-variant", "master-adamw")


@pytest.mark.parametrize("variant", ["ddp", "fsdp2"])
def test_check_passes_and_every_rank_is_timed(variant):
    code, result, tail = _run(variant)
    assert code == 0 and result is not None, tail
    assert result["status"] == "ok" and result["world_size"] == 2 and result["backend"] == "gloo"
    check = result["check"]
    assert (
        check["ok"]
        and check["grad_error"] <= check["tolerance"] == distributed.GRAD_TOLERANCE["fp32"]
    )
    assert check["global_batch"] == 2 * check["check_batch_per_rank"] and not check["missing"]
    timed = result.get("timed_check")
    assert (variant == "fsdp2") == (timed is None)
    assert timed is None or timed["ok"] and timed["grad_error"] <= timed["tolerance"]
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert result["communication"] == [None, None]  # gloo's collectives run on the host
    for rank in result["ranks"]:
        wall = rank["step"]["wall"]
        assert (
            len(wall["samples_ms"]) >= 3
            and wall["median_ms"] > 0
            and rank["step"]["device"] is None
        )
    phases = result["phases"]  # rank 0's parts, each ended, torch.compile's seconds beside
    assert {k for k in phases if not k.endswith("compile_seconds")} == {
        f"{part}_seconds" for part in ("join", "build", "check", "timing")
    }
    assert all(v >= 0 for v in phases.values()) and phases["build_seconds"] > 0
    assert result["part"] is None
    medians = [r["step"]["wall"]["median_ms"] for r in result["ranks"]]
    # the slowest rank's
    assert result["step"] == result["ranks"][medians.index(max(medians))]["step"]
    assert result["tokens_per_s_per_gpu"] == pytest.approx(
        result["tokens_per_step_per_gpu"] / max(medians) * 1e3
    )


@pytest.mark.parametrize("variant, plant", [("ddp", "no-sync"), ("fsdp2", "loss-scale")])
def test_check_refuses_a_planted_bug(variant, plant):
    """Mutation: gradients not all-reduced (DDP's no_sync), or the loss scaled by the world size:
    refused, nothing timed."""
    code, result, tail = _run(variant, plant)
    assert code != 0 and result is not None, tail
    assert result["status"] == "wrong" and not result["check"]["ok"] and "ranks" not in result
    assert result["check"]["grad_error"] > 100 * result["check"]["tolerance"]


# a compiled step: under either wrapper its blocks are compiled one by one
COMPILED = (*CPU, "--step-variant", "compile-default", "--batch-size", "4", "--seq-len", "64")


@pytest.mark.parametrize("plant", ["none", "loss-scale"])
def test_a_compiled_step_under_fsdp2_compiles_per_block_and_is_checked(plant):
    """As torchtitan does: the blocks compiled before fully_shard adds its hooks to them; the check
    passes, and a loss scaled by the world size is still refused. The mutation, FSDP2 compiling
    the model whole, fails the scope here."""
    code, result, tail = _run("fsdp2", plant, extra=COMPILED)
    assert result is not None, tail
    assert result["options"]["compile_scope"] == "blocks"
    assert result["phases"]["check_compile_seconds"] > 0
    check = result["check"]
    if plant == "none":
        assert code == 0 and result["status"] == "ok" and check["ok"], tail
    else:
        assert result["status"] == "wrong" and check["grad_error"] > 100 * check["tolerance"]


def test_the_model_compiled_whole_under_ddp_on_request(monkeypatch, tmp_path):
    """``--compile-scope model`` (the A/B against per block): DDP's forward and the loss compiled
    as one function, checked as ever. One gloo rank in this process, torch.compile's callers
    recorded; the mutation, leaving that function uncompiled, was seen to fail here."""
    import torch
    import torch._dynamo

    compiled: list[str] = []
    real = torch.compile

    def recording(fn=None, **kwargs):
        compiled.append(getattr(fn, "__name__", type(fn).__name__))
        return real(fn, **kwargs)

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0"}
    for key, value in {**env, "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch, "compile", recording)
    out = tmp_path / "result.json"
    args = distributed.parse(
        ["--size", "tiny", "--variant", "ddp", *COMPILED, "--compile-scope", "model"]
        + ["--out", str(out)]
    )
    torch._dynamo.reset()
    try:
        assert distributed.rank_main(args) == 0
    finally:
        torch._dynamo.reset()
    result = json.loads(out.read_text())
    assert result["status"] == "ok" and result["options"]["compile_scope"] == "model"
    assert "ddp_loss" in compiled and result["check"]["ok"]


def test_a_step_timed_without_its_all_reduce_is_refused():
    """Mutation: gradients reduced in the eager check's pass but not in the step as timed (a CUDA
    graph captured without DDP's all-reduces, here the eager step with DDP's sync off): the eager
    check passes, the timed step's check refuses it, nothing is timed."""
    code, result, tail = _run("ddp", "timed-no-sync")
    assert code != 0 and result is not None, tail
    assert result["check"]["ok"] and not result["timed_check"]["ok"], result
    assert result["status"] == "wrong" and "ranks" not in result
    assert result["timed_check"]["grad_error"] > 100 * result["timed_check"]["tolerance"]


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the master AdamW's Triton kernel needs a GPU"
)
@pytest.mark.parametrize("plant", ["none", "timed-no-sync"])
def test_master_adamw_under_ddp_uses_the_reduced_gradients(plant):
    """best-kernels' optimizer under DDP: the step as timed updates from the all-reduced
    gradients (within bf16's tolerance); without the all-reduce, refused."""
    code, result, tail = _run("ddp", plant, extra=MASTER)
    assert result is not None, tail
    assert result["options"]["optimizer"] == "master" and result["check"]["ok"], result
    timed = result["timed_check"]
    if plant == "none":
        assert code == 0 and result["status"] == "ok" and timed["ok"], (timed, tail)
    else:
        assert code != 0 and result["status"] == "wrong" and not timed["ok"]
        assert timed["grad_error"] > 3 * timed["tolerance"]


def test_case_stores_the_slowest_rank_and_the_scaling_efficiency():
    one_gpu: dict[str, float] = {}

    def work(world):
        return distributed.distributed_work(
            "tiny", "ddp", world, "cpu", one_gpu, extra=CPU, timeout_s=240
        )

    one = measure_case(
        Case({"variant": "ddp", "world_size": "1"}, lambda: work(1)), device="cpu", budget_s=300
    )
    two = measure_case(
        Case({"variant": "ddp", "world_size": "2"}, lambda: work(2)), device="cpu", budget_s=300
    )
    assert one["status"] == two["status"] == "ok", (one.get("reason"), two.get("reason"))
    assert one["info"]["scaling_efficiency"] == pytest.approx(1.0)
    rate = two["info"]["tokens_per_s_per_gpu"]
    assert two["info"]["scaling_efficiency"] == pytest.approx(rate / one_gpu["ddp"])
    assert len(two["info"]["ranks"]) == 2 and two["check"]["ok"]
    slowest = two["info"]["ranks"][two["info"]["slowest_rank"]]["step"]
    assert two["metrics"]["step"] == slowest and two["info"]["primary_clock"] == "wall"


def test_case_skips_without_enough_gpus():
    with pytest.raises(NotImplementedError, match="needs 2 GPUs, this machine has 0"):
        distributed.distributed_work("1B", "ddp", 2, "cpu")


def test_a_wrong_case_is_recorded_wrong_and_not_timed():
    def work():
        return distributed.distributed_work(
            "tiny", "ddp", 2, "cpu", extra=(*CPU, "--plant", "loss-scale"), timeout_s=240
        )

    rec = measure_case(
        Case({"variant": "ddp", "world_size": "2"}, work), device="cpu", budget_s=300
    )
    assert rec["status"] == "wrong" and rec["metrics"] == {} and "loss" in rec["reason"]


def test_runner_stores_a_measurement_taken_elsewhere():
    """Work.measured: stored as it is beside what ``timed`` times, after the check; a failing check
    stores none."""
    from optbench.measure.timing import Measurement, Timing
    from optbench.run.runner import WrongResult

    taken = Measurement(device=None, wall=Timing((2.0, 3.0, 4.0), "perf-counter")).to_dict()
    ok = measure_case(
        Case({"v": "a"}, lambda: distributed_work_stub(taken, lambda: {"ok": True})),
        device="cpu",
        budget_s=30,
    )
    assert ok["status"] == "ok" and ok["metrics"] == {"step": taken}

    def wrong():
        raise WrongResult("off")

    bad = measure_case(
        Case({"v": "b"}, lambda: distributed_work_stub(taken, wrong)), device="cpu", budget_s=30
    )
    assert bad["status"] == "wrong" and bad["metrics"] == {}


def distributed_work_stub(taken, check):
    from optbench.run.runner import Work

    return Work(timed={}, check=check, measured={"step": taken})


def test_the_timed_steps_check_leaves_the_step_as_timing_finds_it(monkeypatch):
    """check_timed_step feeds its own batch, lifts clipping and runs an optimizer step: afterwards
    the step's batch, weights, hyper-parameters and (fresh) optimizer state are those it had. One
    gloo rank in this process."""
    import torch
    import torch.distributed as dist

    from models.config import CONFIGS
    from models.step import BASELINE, build_step

    port = free_port()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    step = None
    try:
        options = BASELINE.replace(precision="fp32", batch_size=2, seq_len=32)
        step = build_step(CONFIGS["tiny"], options, "cpu", 0, capture=False)
        distributed._wrap(step, "ddp", torch.device("cpu"), "none")
        before = {n: w.clone() for n, w in step.weights().items()}
        batch, hyper = step.idx.clone(), step.hyper
        timed = distributed.check_timed_step(
            step, CONFIGS["tiny"], options, torch.device("cpu"), 0, lambda: None
        )
        assert timed["ok"] and timed["grad_error"] <= timed["tolerance"], timed
        assert all(torch.equal(w, before[n]) for n, w in step.weights().items())
        assert torch.equal(step.idx, batch) and step.hyper == hyper
        states = [v for s in step.optimizer.state.values() for v in s.values()]
        assert all(not torch.is_tensor(v) or not v.any() for v in states)
    finally:
        step = None  # the DDP wrapper's reducer first (distributed.leave says why)
        distributed.leave()


@pytest.mark.parametrize("ending", ["ok", "error"])
def test_a_rank_leaves_its_group_holding_no_step(monkeypatch, tmp_path, ending):
    """rank_main frees its step (the DDP wrapper, whose reducer holds the group) before it leaves
    the group, whether its parts end or raise: a group freed by the reducer joins gloo's workers
    holding the GIL, and a worker still freeing a finished collective's tensors waits for it (a CI
    run hung so). One gloo rank in this process. Mutation: a step kept in rank_main's frame, or
    in the frames of a raising part's traceback, is seen alive at destroy_process_group, and
    fails."""
    import weakref

    import torch.distributed as dist

    port = free_port()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1"}
    for key, value in {**env, "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    ours: list[weakref.ref] = []  # this run's DDP wrapper, not another test's
    wrap = distributed._wrap

    def recorded_wrap(step, *args):
        no_sync = wrap(step, *args)
        ours.append(weakref.ref(step.ddp))
        return no_sync

    alive_at_destroy: list[bool] = []
    destroy = dist.destroy_process_group

    def spy(*args, **kwargs):
        alive_at_destroy.append(any(ref() is not None for ref in ours))
        return destroy(*args, **kwargs)

    def failing_timing(*_):
        raise RuntimeError("a planted error in the timing")

    monkeypatch.setattr(distributed, "_wrap", recorded_wrap)
    monkeypatch.setattr(dist, "destroy_process_group", spy)
    if ending == "error":
        monkeypatch.setattr(distributed, "_timed", failing_timing)
    out = tmp_path / "result.json"
    args = distributed.parse(["--size", "tiny", "--variant", "ddp", *CPU, "--out", str(out)])
    if ending == "ok":
        assert distributed.rank_main(args) == 0
        assert json.loads(out.read_text())["status"] == "ok"
    else:
        with pytest.raises(RuntimeError, match="planted error"):
            distributed.rank_main(args)
    assert len(ours) == 1 and alive_at_destroy == [False]


def test_a_stopped_launch_says_how_far_rank_0_got(tmp_path, capsys):
    """Rank 0 writes its result after each part, so a launch stopped midway (a case's budget)
    names the parts it ended and the one it was in. Mutation: a progress that reads no part, or
    names the wrong part, fails; a launch stopped before any result says so, and is not silent."""
    out = tmp_path / "result.json"
    assert distributed.progress(out) == "rank 0 ended no part; it was in: join"
    phases = {"join_seconds": 2.0, "build_seconds": 41.25}
    out.write_text(json.dumps({"phases": phases, "part": "check"}))
    assert distributed.progress(out) == "rank 0 ended join 2.0 s, build 41.2 s; it was in: check"
    with_compile = {"join_seconds": 1, "build_seconds": 50, "build_compile_seconds": 30}
    # a build that raised: its seconds are counted, and the part named is still the build
    assert distributed.progress_of({"phases": with_compile, "part": "build"}) == (
        "rank 0 ended join 1.0 s, build 50.0 s, build (torch.compile) 30.0 s; it was in: build"
    )
    with pytest.raises(subprocess.TimeoutExpired) as stopped:
        distributed.launch(2, "--size", "tiny", "--variant", "ddp", *CPU, timeout_s=0.5)
    assert "optbench: torchrun with 2 ranks stopped; rank 0 ended" in capsys.readouterr().err
    # and the exception carries it to the case's record (asv drops a skipped case's stderr)
    assert stopped.value.__notes__[0].startswith("torchrun with 2 ranks stopped; rank 0 ended")


def test_the_reference_accumulates_the_shards_to_the_global_batchs_gradient():
    """The check's single-process reference takes the global batch as the ranks' shards with their
    gradients accumulated (each pass the shape the ranks run): the mean loss and gradient of the
    whole batch in one pass, to fp32 rounding, and the step's own batch left as it was. Mutation:
    shards' losses not divided by their number (the gradient 2x) or one shard dropped fail."""
    import torch

    from models.config import CONFIGS
    from models.step import BASELINE, build_step

    config = CONFIGS["tiny"]
    whole = build_step(config, BASELINE.replace(precision="fp32", batch_size=4, seq_len=32), "cpu")
    tokens = torch.randint(
        0, config.vocab_size, (4, 33), generator=torch.Generator().manual_seed(1)
    )
    loss, grads = distributed._raw_grads(whole, [tokens])
    part = build_step(config, BASELINE.replace(precision="fp32", batch_size=2, seq_len=32), "cpu")
    batch = part.idx.clone()
    shard_loss, shard_grads = distributed._raw_grads(part, list(tokens.split(2)))
    assert torch.equal(part.idx, batch)
    assert shard_loss.item() == pytest.approx(loss.item(), rel=1e-6)
    assert shard_grads.keys() == grads.keys()
    worst = max(
        ((shard_grads[n] - g).norm() / g.norm()).item() for n, g in grads.items() if g.norm() > 0
    )
    assert worst < 1e-5


def test_the_wrapped_step_compiles_once_for_the_shape_it_is_timed_at(monkeypatch, tmp_path):
    """The check's passes have the timed step's batch per rank: torch.compile compiles the wrapped
    step for that one shape, as its users compile for the shape they run, and does not recompile it
    for a dynamic batch when the timing starts (a check at 2 sequences per rank did so, timing at 4:
    the mutation, seen to fail here with --check-batch 2). One gloo rank in this process; under DDP
    the blocks compile one by one, the first block's graph apart (it adds no residual): dynamo's
    recompiles are logged, and none may be for a tensor's size."""
    import logging

    import torch._dynamo
    import torch._logging
    from torch._dynamo.guards import recompiles_log

    class Reasons(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    port = free_port()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1"}
    for key, value in {**env, "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    torch._dynamo.reset()
    reasons = Reasons()
    torch._logging.set_logs(recompiles=True)
    recompiles_log.addHandler(reasons)
    out = tmp_path / "result.json"
    options = ["--step-variant", "compile-default", "--batch-size", "4", "--seq-len", "32"]
    args = distributed.parse(
        ["--size", "tiny", "--variant", "ddp", *CPU, *options, "--out", str(out)]
    )
    try:
        assert distributed.rank_main(args) == 0
    finally:
        recompiles_log.removeHandler(reasons)
        torch._logging.set_logs()
        torch._dynamo.reset()
    result = json.loads(out.read_text())
    assert result["status"] == "ok" and result["check"]["check_batch_per_rank"] == 4
    assert result["options"]["compile_scope"] == "blocks" and reasons.messages
    assert not [m for m in reasons.messages if "size mismatch" in m]
