"""Multi-GPU training steps through PyTorch's own distributed stack: torchrun, DDP and FSDP2.

Run under torchrun (one process per GPU; ``--standalone`` picks a free rendezvous port)::

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m optbench.suite.distributed \\
        --size 1B --variant ddp --out result.json

Several hosts: the same command on each, with c10d rendezvous in place of ``--standalone``
(:func:`torchrun_args`; ``docs/runners.md``, "Several hosts").

Every rank builds the same training step (``models.step.build_step``: same seed, same init) with
this machine's baseline options for the size (``optbench.suite.baseline.base_options``; per-rank
batch as a single GPU's step has it: weak scaling, the global batch is world size x that), then

- ``ddp``: wraps the model in ``torch.nn.parallel.DistributedDataParallel`` (gradients all-reduced,
  averaged, in buckets during the backward) with torchtitan's 100 MB buckets (its ``apply_ddp``);
- ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on every block, then on the root (parameters,
  gradients and optimizer states sharded: DTensors; fp32 parameters, reduced in fp32, under the
  step's bf16 autocast: no ``MixedPrecisionPolicy``), and builds the optimizer on the sharded
  parameters;
- under either, a compiled step is compiled per block (``compile_scope`` 'blocks', the step variant
  ``compile-regional``'s), as torchtitan compiles its blocks before it wraps them. Compiled whole
  under DDP, the model's graph is split by dynamo's DDPOptimizer where each bucket ends (so that its
  all-reduce can start while the backward goes on) and the pieces are traced past AOTAutograd's
  cache (``fakify_first_call``): every case traced the whole forward and backward again, however
  warm the cache. Per block, dynamo traces one block's graph for all but the first (which adds no
  residual) and the first's (DDPOptimizer still splits a block where a bucket ends in it, and such
  pieces still miss the cache, but a block is a small part of the model); under FSDP2 the blocks
  are compiled before fully_shard adds its hooks to them, as torchtitan orders it; the blocks'
  backwards are autograd nodes of their own, their gradients ready block by block.
  ``--compile-scope model`` compiles the wrapped forward and loss whole instead (a probe's A/B);
- ``ddp-best`` / ``fsdp2-best``: the same on top of the ``best`` single-GPU combination
  (``models.variants``: Triton RMSNorm and SwiGLU, our fused linear cross-entropy, foreach gradient
  statistics, fused AdamW, no per-step ``.item()``, SDPA ``is_causal``, torch.compile 'default').
- ``ddp-best-kernels``: DDP around the single-GPU flagship, ``best-kernels``, whose whole step
  (forward, backward with DDP's bucketed all-reduces, clipping, the master-weight AdamW reading the
  reduced bf16 gradients) is one CUDA graph. NCCL collectives can be captured (NCCL's "Using NCCL
  with CUDA Graphs"; PyTorch keeps captured work from its watchdog); PyTorch's CUDA graphs notes ask
  for DDP to be built on a side stream and for 11 eager DDP steps before the capture, so that its
  reducer has built its buckets: the step is built uncaptured (``build_step(capture=False)``),
  wrapped, checked, then captured. No ``fsdp2-best-kernels``: the master-weight AdamW (Triton, bf16
  weights) takes neither DTensor parameters nor sharded states.

1. The check, before any timing: one global batch (world size x ``check_batch`` sequences, drawn
   from the seed on every rank) is split, rank r taking its r-th shard; each rank runs forward and
   backward of its shard through the wrapper (with its gradient reduction), and the gradients
   (FSDP2: ``full_tensor()`` of the DTensor gradients, an all-gather) and the mean loss over ranks
   are compared on rank 0 with a single-process step of the same options on the whole global batch
   (run first on rank 0), taken as the ranks' shards one after another with their gradients
   accumulated, each shard's loss divided by the world size: the mean over the global batch, as a
   single-GPU user reaches a larger batch. A shard is the timed step's batch per rank (unless
   ``--check-batch`` sets fewer), so every pass has the shape the step is timed at, at every world
   size: the wrapped step compiles for that one shape (a check at another batch made torch.compile
   recompile the timed step for a dynamic batch), and the reference's graphs are the single-GPU
   step's (from the compile cache).
   Under torch.compile's CUDA-graph modes, where a replay overwrites the gradients of the one
   before, the reference runs the whole global batch in one pass. The gradients are the raw ones,
   before clipping (clipping to a norm would hide a gradient scaled by the world size). Relative
   error is ``kernels.numerics.rel_err``, per parameter, the worst one compared with
   :data:`GRAD_TOLERANCE`: fp32 (a CPU): 1e-4, what summing the same products in another order can
   change (the shards' gradients summed by the all-reduce against the same summed by the
   accumulation: rounding of ~2^-24 per addition over a few thousand terms gives ~1e-6; 100x
   margin). bf16 autocast: 0.15. Both the distributed and the single-process step round their
   matmuls to bf16 (the weight gradient of each shard is rounded before it is summed, by the
   all-reduce or by the accumulation), so each is a bf16 step off the exact gradient by what a bf16
   step is: up to 4.4e-2 at 1B (``models.step``'s note on CHECK_CEILING). Two independent such
   errors differ by up to sqrt(2) x 4.4e-2 = 6.2e-2; 2.5x that (``models.step.CHECK_FACTOR``, the
   factor the step check allows over the eager step's own error) is 0.16, rounded down to 0.15. The
   bugs it is there for are larger: a gradient scaled by the world size is off by (N - 1) (1.0 at
   N=2); a skipped all-reduce leaves each rank its own shard's gradient, on the tiny config 1.04 off
   the global mean at its worst parameter (fp32, 2 ranks; ``tests/test_distributed.py``). A failing
   check writes the result with status 'wrong', each rank exits with :data:`WRONG_EXIT` (torchrun
   then fails); nothing is timed.
   Then, under DDP, the step as it is timed (:func:`check_timed_step`): the eager pass above does
   not run the captured graph, whose all-reduces are its own. Each rank feeds its own batch (the
   step's batch size), takes the gradients of an eager forward and backward through DDP (reduced,
   and checked above), then runs one step as timed (a graph replay where the step captures one,
   clipping off) and compares the gradients that step's optimizer used with those, at the same
   tolerance. A capture without the all-reduces leaves each rank its own gradient: off by about
   1 (the 'timed-no-sync' plant).
2. The timing: every rank runs the same number of steps (collectives pair them up): 3 steps to
   estimate a step's time, whose slowest rank's figure sizes the warm-up (``warmup_ms`` of steps)
   and the samples (one optimizer step each, ``rep_ms`` of them, at least ``min_reps``); each sample
   is the wall time of one step between two device synchronizations (perf_counter) and the
   CUDA-event time of the same step.
3. On GPUs, :data:`PROFILE_STEPS` more steps under torch.profiler on every rank: the collectives'
   time per step, the part other kernels hid and the part exposed (``optbench.measure.overlap``).
4. Rank 0 writes one JSON file (``--out``), after each part of its run (join, build, check, timing:
   ``phases``, their seconds, torch.compile's beside each; ``part``, the one it is in), so that a
   launch stopped midway says how far it got (:func:`progress`); at the end: every rank's samples
   and medians (``ranks``), the slowest rank's timing as the figure (``step``: the rank with the
   largest wall median; a step ends when its slowest rank's does), tokens per step per GPU, tokens/s
   per GPU at the slowest rank's median, world size, the checks, each rank's communication
   (``communication``: None on a CPU, where gloo's collectives run on the host).

The asv side (``benchmarks/bench_distributed.py``) launches this through :func:`launch` and stores
one record per (variant, world size): the world size is a parameter of the record key, so a
comparison across commits (``optbench.gate.compare``) only ever sets a 2-GPU figure beside a 2-GPU
figure, never beside a 1-GPU one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optbench.run.helptext import plain
from optbench.store.store import REPO_ROOT
from optbench.suite.catalog import DISTRIBUTED_VARIANTS

WRAPPERS = ("ddp", "fsdp2")
# see the module docstring
GRAD_TOLERANCE = {"fp32": 1e-4, "tf32": 0.15, "bf16": 0.15, "fp16": 0.15}
# bugs planted for the checks' own tests: no gradient sync at all, a loss scaled by the world
# size, no sync in the step as timed only (DDP)
PLANTS = ("none", "no-sync", "loss-scale", "timed-no-sync")
DDP_CAPTURE_WARMUP = 11  # eager DDP steps before a capture (module docstring)
DDP_BUCKET_MB = 100  # torchtitan's (``replicate(model, bucket_cap_mb=100)``); DDP's default is 25
PROFILE_STEPS = 3  # steps profiled for the communication figures
WRONG_EXIT = 3
SKIP_EXIT = 4
RDZV_ID = "optbench"  # the c10d rendezvous id every node of one launch passes


# --- inside each rank
# ---------------------------------------------------------------------------------------


def _dist():
    import torch.distributed as dist

    return dist


def _wrap(step: Any, wrapper: str, device: Any, plant: str) -> Callable[[], None]:
    """Wrap ``step.model`` for ``wrapper`` in place of its forward + loss; returns a function that
    turns the gradient reduction off (the 'no-sync' plant), else a no-op."""
    import torch

    from models.step import _adamw, _model_loss, compile_kwargs

    dist = _dist()
    world = dist.get_world_size()
    scale = float(world) if plant == "loss-scale" else 1.0
    whole = bool(step.options.compile) and step.options.compile_scope == "model"

    def compiled(fn: Callable) -> Callable:  # the model compiled whole (--compile-scope model)
        return torch.compile(fn, **compile_kwargs(step.options)) if whole else fn

    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        graphed = step.options.cuda_graph  # built on a side stream, warmed up before capture
        with torch.cuda.stream(torch.cuda.Stream(device)) if graphed else contextlib.nullcontext():
            ddp = DistributedDataParallel(step.model, device_ids=ids, bucket_cap_mb=DDP_BUCKET_MB)
        if graphed:
            step.capture_warmup = DDP_CAPTURE_WARMUP
        step.ddp = ddp

        # ``model`` is step.model: the forward goes through DDP
        def ddp_loss(model, loss, idx, targets):
            hidden = ddp(idx).flatten(0, 1)
            return loss(hidden, ddp.module.lm_head.weight, targets.flatten()) * scale

        step._model_loss_fn = compiled(ddp_loss)

        def no_sync() -> None:
            ddp.require_backward_grad_sync = False  # what DDP.no_sync() sets inside its block

        return no_sync
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    for block in step.model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(step.model, mesh=mesh)
    step.params = list(step.model.parameters())  # DTensors now: the optimizer takes the shards
    step.optimizer = _adamw(step.model, step.options.optimizer, step.options.cuda_graph, step.hyper)
    if scale != 1.0:

        def scaled_loss(model, loss, idx, targets):
            return _model_loss(model, loss, idx, targets) * scale

        step._model_loss_fn = compiled(scaled_loss)

    def no_sync_fsdp() -> None:
        step.model.set_requires_gradient_sync(False)

    return no_sync_fsdp


def _full(t: Any) -> Any:
    """The whole tensor of a (possibly sharded DTensor) gradient or parameter, on every rank."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _raw_grads(step: Any, shards: list[Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """Forward and backward (no clipping, no optimizer step) of the step's current batch, or of
    each batch of ``shards`` (token rows, inputs and targets) with each one's loss divided by their
    number and the gradients accumulated: the mean loss and gradient over them. Returns (loss,
    gradients by parameter name: whole fp32 tensors on the step's device, where the check compares
    them: at 1B each rank's 4.4 GB took seconds to reach the host, and the float64 comparison
    there more, every rank at once on the host's shared CPUs)."""
    import torch

    step.optimizer.zero_grad(set_to_none=True)
    kept = step.idx, step.targets
    batches = [kept] if shards is None else [(t[:, :-1], t[:, 1:]) for t in shards]
    total = 0.0
    try:
        with step._matmul_precision():
            for inputs, targets in batches:
                step.idx, step.targets = inputs.contiguous(), targets.contiguous()
                loss = step._forward_loss() / len(batches)
                loss.backward()
                total = total + loss.detach().float()
    finally:
        step.idx, step.targets = kept
    grads = {
        # a copy: the step may reuse its gradient tensors (a captured graph, DDP's buckets)
        name: _full(p.grad).detach().to(torch.float32, copy=True)
        for name, p in step.model.named_parameters()
        if p.grad is not None
    }
    step.optimizer.zero_grad(set_to_none=True)
    return total, grads


def _global_batch(config: Any, rows: int, seq_len: int, seed: int, device: Any) -> Any:
    import torch

    gen = torch.Generator(device).manual_seed(seed + 1)  # not the steps' own batch
    return torch.randint(0, config.vocab_size, (rows, seq_len + 1), generator=gen, device=device)


def check(
    step: Any, config: Any, options: Any, device: Any, seed: int, check_batch: int
) -> dict[str, Any]:
    """The gradient check of the module docstring, on every rank; returns its record (on every
    rank), with ``ok``."""
    import torch

    from kernels.numerics import rel_err
    from models.step import GRAPHED_COMPILE_MODES, build_step

    dist = _dist()
    rank, world = dist.get_rank(), dist.get_world_size()
    tokens = _global_batch(config, world * check_batch, options.seq_len, seed, device)
    ref_loss, ref_grads = None, {}
    # the single-process step on the whole global batch, first (its memory freed after)
    if rank == 0:
        # forward and backward only: a graphed variant's reference is left uncaptured. Under
        # torch.compile's CUDA-graph modes a replay overwrites the gradients of the one before, so
        # there the whole global batch goes in one pass
        whole = options.compile in GRAPHED_COMPILE_MODES
        rows = world * check_batch if whole else check_batch
        ref = build_step(config, options.replace(batch_size=rows), device, seed, capture=False)
        ref_loss, ref_grads = _raw_grads(ref, list(tokens.split(rows)))
        del ref
        if device.type == "cuda":
            torch.cuda.empty_cache()
    dist.barrier()
    loss, grads = _raw_grads(step, [tokens[rank * check_batch : (rank + 1) * check_batch]])
    dist.all_reduce(loss, op=dist.ReduceOp.SUM)
    loss = loss / world
    record: dict[str, Any] = {
        "ok": True,
        "check_batch_per_rank": check_batch,
        "global_batch": world * check_batch,
        "precision": options.precision,
        "tolerance": GRAD_TOLERANCE[options.precision],
        "reference": (
            "single process, same options, whole global batch: the ranks' shards with their "
            "gradients accumulated (rank 0)"
        ),
    }
    if rank == 0:
        record.update(
            loss_error=rel_err(loss.cpu(), ref_loss.cpu()), **_grad_errors(grads, ref_grads)
        )
        record["ok"] = bool(
            record["grad_error"] <= record["tolerance"]
            and record["loss_error"] <= record["tolerance"]
            and not record["missing"]
        )
    shared = [record]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def _grad_errors(got: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    """The worst parameter's relative gradient error (``kernels.numerics.rel_err``; infinite where
    the two name different parameters), that parameter, and the names only one side has."""
    from kernels.numerics import rel_err

    per_param = (
        {name: rel_err(got[name], expected[name]) for name in expected}
        if got.keys() == expected.keys()
        else {}
    )
    worst = max(per_param, key=per_param.__getitem__) if per_param else None
    return {
        "grad_error": per_param[worst] if worst else math.inf,
        "worst_param": worst,
        "missing": sorted(got.keys() ^ expected.keys()),
    }


def check_timed_step(
    step: Any, config: Any, options: Any, device: Any, seed: int, plant: Callable[[], None]
) -> dict[str, Any]:
    """The timed step's check of the module docstring (DDP), on every rank; ``plant`` runs before
    the step is captured or called (the 'timed-no-sync' plant, else a no-op). Returns its record,
    the worst rank's errors, with ``ok``. The step is left as timing finds it: its batch, weights,
    a fresh optimizer state and its own hyper-parameters (a graphed step captured with them)."""
    import dataclasses

    import torch

    dist = _dist()
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = options.batch_size
    tokens = _global_batch(config, world * rows, options.seq_len, seed + 1, device)
    original = torch.cat([step.idx, step.targets[:, -1:]], dim=1).clone()
    step.feed(tokens[rank * rows : (rank + 1) * rows])
    timed_hyper, initial = step.hyper, step.snapshot()
    try:
        expected = step.model.unfused(_raw_grads(step)[1])
        plant()
        step.tune(dataclasses.replace(timed_hyper, max_grad_norm=math.inf))
        if options.cuda_graph and step._graph is None:
            step.capture()
        step()
        got = {name: _full(g).float() for name, g in step.grads().items()}
    finally:
        step.feed(original)
        step.restore(initial)  # before a graphed step is captured again with timed_hyper
        step.tune(timed_hyper)
    ranks: list[Any] = [None] * world
    dist.all_gather_object(ranks, _grad_errors(got, expected))
    # a NaN error is the worst
    worst = max(ranks, key=lambda r: math.inf if math.isnan(r["grad_error"]) else r["grad_error"])
    tolerance = GRAD_TOLERANCE[options.precision]
    return {
        **worst,
        "rank": ranks.index(worst),
        "tolerance": tolerance,
        "graphed": step._graph is not None,
        "reference": "each rank's eager forward and backward through DDP, same batch",
        "ok": bool(worst["grad_error"] <= tolerance and not worst["missing"]),
    }


def communication(step: Any, device: Any) -> dict[str, Any] | None:
    """This rank's collectives over :data:`PROFILE_STEPS` steps under torch.profiler, per step
    (``optbench.measure.overlap.Overlap``); None off CUDA. Every rank must call it (the steps'
    collectives pair up)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    from optbench.measure.overlap import Overlap

    _sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILE_STEPS):
            step()
        _sync(device)
    return Overlap.of_profile(prof.events(), PROFILE_STEPS).to_dict()


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_steps(step: Any, device: Any, count: int) -> tuple[list[float], list[float]]:
    """``count`` optimizer steps, each timed alone: (wall ms, CUDA-event ms; [] on a CPU)."""
    import torch

    wall, events = [], []
    for _ in range(count):
        marks = (
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            if device.type == "cuda"
            else None
        )
        _sync(device)
        start = time.perf_counter()
        if marks:
            marks[0].record()
        step()
        if marks:
            marks[1].record()
        _sync(device)
        wall.append((time.perf_counter() - start) * 1e3)
        if marks:
            events.append(marks[0].elapsed_time(marks[1]))
    return wall, events


def time_step(
    step: Any, device: Any, warmup_ms: float, rep_ms: float, min_reps: int, max_reps: int = 1000
) -> dict[str, Any]:
    """Timing of the module docstring on every rank: a ``Measurement.to_dict()`` of this rank's
    samples."""
    import torch

    from optbench.measure.timing import Measurement, Timing

    dist = _dist()
    probe, _ = _time_steps(step, device, 3)
    slowest = torch.tensor([min(probe)], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # every rank sizes its loops alike
    estimate = max(float(slowest), 1e-3)
    _time_steps(step, device, max(0, math.ceil(warmup_ms / estimate) - 3))
    count = max(min_reps, min(max_reps, math.ceil(rep_ms / estimate)))
    dist.barrier()
    wall, events = _time_steps(step, device, count)
    device_timing = Timing(tuple(events), "cuda-events") if events else None
    return Measurement(device=device_timing, wall=Timing(tuple(wall), "perf-counter")).to_dict()


def _options(
    size: str,
    step_variant: str,
    device: Any,
    precision: str | None,
    batch_size: int | None,
    seq_len: int | None,
    compile_scope: str,
) -> Any:
    """The options of ``step_variant`` for this machine with the overrides given, a compiled step
    compiled per block (the module docstring) unless ``compile_scope`` is 'model'."""
    from optbench.suite.workloads import step_options

    options = step_options(size, step_variant, str(device))[1]
    changes = {
        k: v
        for k, v in {"precision": precision, "batch_size": batch_size, "seq_len": seq_len}.items()
        if v is not None
    }
    if options.compile:
        changes["compile_scope"] = compile_scope
    return options.replace(**changes)


def _join(device_kind: str, backend: str | None) -> tuple[Any, int]:
    """(this rank's device, its local rank), with the process group initialized: the GPU of
    LOCAL_RANK for ``device_kind`` 'cuda' (NCCL by default), else the CPU (gloo)."""
    import torch

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    _dist().init_process_group(
        backend or ("nccl" if device.type == "cuda" else "gloo"),
        device_id=device if device.type == "cuda" else None,
    )
    return device, local


def _timed(step: Any, device: Any, local: int, args: argparse.Namespace) -> dict[str, Any]:
    """The result's timing fields: every rank times the step (:func:`time_step`), the ranks'
    timings are gathered (each with its host, local rank and node: torchrun's GROUP_RANK), and the
    slowest rank's median is the figure; then each rank's :func:`communication`."""
    dist = _dist()
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = time_step(step, device, args.warmup_ms, args.rep_ms, args.min_reps)
    ranks: list[Any] = [None] * world
    dist.all_gather_object(
        ranks,
        {
            "rank": rank,
            "host": os.uname().nodename,
            "local_rank": local,
            "node": int(os.environ.get("GROUP_RANK", "0")),
            "step": mine,
        },
    )
    medians = [r["step"]["wall"]["median_ms"] for r in ranks]
    slowest = max(range(world), key=medians.__getitem__)
    overlaps: list[Any] = [None] * world
    dist.all_gather_object(overlaps, communication(step, device))
    return {
        "communication": overlaps,
        "status": "ok",
        "ranks": ranks,
        "wall_median_ms": medians,
        "device_median_ms": [(r["step"]["device"] or {}).get("median_ms") for r in ranks],
        "slowest_rank": slowest,
        "step": ranks[slowest]["step"],
        "tokens_per_s_per_gpu": step.tokens_per_step / (medians[slowest] / 1e3),
    }


class _Ended(Exception):
    """A rank's part ended before the timing: its status ('skipped' or 'wrong'), the reason, the
    exit code."""

    def __init__(self, status: str, reason: str, code: int):
        super().__init__(reason)
        self.status, self.reason, self.code = status, reason, code


def _built(args: argparse.Namespace, device: Any, wrapper: str, step_variant: str) -> Any:
    """(options, config, step, the wrapper's sync switch): the step of ``step_variant`` for this
    machine, built uncaptured and wrapped; :class:`_Ended` 'skipped' where it cannot run here."""
    from models.config import CONFIGS
    from models.step import UnsupportedOptions, build_step
    from optbench.suite.plan import step_skip_reason
    from optbench.suite.workloads import machine_profile

    if args.precision is None:
        reason = step_skip_reason(machine_profile(str(device)), args.size, step_variant)
        if reason:
            raise _Ended("skipped", reason, SKIP_EXIT)
    options = _options(
        args.size,
        step_variant,
        device,
        args.precision,
        args.batch_size,
        args.seq_len,
        args.compile_scope,
    )
    config = CONFIGS[args.size]
    try:
        if wrapper == "fsdp2" and options.cuda_graph:
            raise UnsupportedOptions(
                "fsdp2 runs no captured step: the master-weight AdamW of a graphed variant "
                "takes no DTensor parameters"
            )
        step = build_step(config, options, device, args.seed, capture=False)
    except UnsupportedOptions as exc:
        raise _Ended("skipped", str(exc), SKIP_EXIT) from exc
    no_sync = _wrap(step, wrapper, device, args.plant)
    if args.plant == "no-sync":
        no_sync()
    return options, config, step, no_sync


def _checked(
    step: Any,
    config: Any,
    options: Any,
    device: Any,
    args: argparse.Namespace,
    wrapper: str,
    no_sync: Callable[[], None],
    result: dict[str, Any],
) -> None:
    """The checks of the module docstring, their records into ``result`` ('check', and
    'timed_check' under DDP); :class:`_Ended` 'wrong' where one fails."""
    world = _dist().get_world_size()
    rows = min(options.batch_size, args.check_batch or options.batch_size)
    checked = check(step, config, options, device, args.seed, rows)
    result["check"] = checked
    if not checked["ok"]:
        raise _Ended(
            "wrong",
            f"{args.variant} at world size {world}: gradients or loss off the single-process "
            f"step's: {checked}",
            WRONG_EXIT,
        )
    if options.cuda_graph and device.type == "cuda":
        # CUPTI set up before the first capture: a graph captured before the first profiler
        # session can fault or hang when profiled (pytorch/pytorch#75504)
        from torch.profiler._utils import _init_for_cuda_graphs

        _init_for_cuda_graphs()
    if wrapper != "ddp":
        return
    plant = no_sync if args.plant == "timed-no-sync" else lambda: None
    timed = check_timed_step(step, config, options, device, args.seed, plant)
    result["timed_check"] = timed
    if not timed["ok"]:
        raise _Ended(
            "wrong",
            f"{args.variant} at world size {world}: the timed step's gradients are off the "
            f"reduced ones: {timed}",
            WRONG_EXIT,
        )


def rank_main(args: argparse.Namespace) -> int:
    """One rank's part: build, wrap, check, time; rank 0 writes the result, also after each part
    (its ``phases``: seconds of each, torch.compile's beside them), so that a launch stopped midway
    says how far it got. Returns the exit code: 0, :data:`SKIP_EXIT` or :data:`WRONG_EXIT`."""
    from optbench.run.runner import timed_phase
    from optbench.store.store import write_text_atomic

    dist = _dist()
    phases: dict[str, float] = {}
    with timed_phase(phases, "join_seconds"):
        device, local = _join(args.device, args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    wrapper, step_variant = DISTRIBUTED_VARIANTS[args.variant]
    step_variant = args.step_variant or step_variant
    result: dict[str, Any] = {
        "variant": args.variant,
        "wrapper": wrapper,
        "step_variant": step_variant,
        "size": args.size,
        "world_size": world,
        "backend": dist.get_backend(),
        "device": device.type,
        "plant": args.plant,
        "phases": phases,
    }

    def save() -> None:
        if rank == 0 and args.out:
            write_text_atomic(Path(args.out), json.dumps(result, default=str))

    try:
        _parts(args, device, local, wrapper, step_variant, result, save)
        result["part"] = None
        return 0
    except _Ended as ended:
        result.update(status=ended.status, reason=ended.reason)
        return ended.code
    except BaseException as exc:
        # the traceback's frames hold the step until the exception is handled: their locals go
        # first, so that an error cannot hang the rank in leave(); the traceback still prints
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        save()
        leave()


def _parts(
    args: argparse.Namespace,
    device: Any,
    local: int,
    wrapper: str,
    step_variant: str,
    result: dict[str, Any],
    save: Callable[[], None],
) -> None:
    """rank_main's build, check and timing, each named in ``result`` before it starts and timed
    into its ``phases``; the step they share is freed on return (rank_main clears the frames of
    an exception's traceback), before the rank leaves its group (see :func:`leave`)."""
    from optbench.run.runner import timed_phase

    phases = result["phases"]
    result["part"] = "build"
    save()
    with timed_phase(phases, "build_seconds", compile_field="build_compile_seconds"):
        options, config, step, no_sync = _built(args, device, wrapper, step_variant)
    result.update(
        options={k: getattr(options, k) for k in options.__dataclass_fields__},
        tokens_per_step_per_gpu=step.tokens_per_step,
        global_batch=result["world_size"] * options.batch_size,
        flops_per_step_per_gpu=float(step.flops_per_step),
        params=sum(_full(p).numel() for p in step.model.parameters()),
    )
    result["part"] = "check"
    save()
    with timed_phase(phases, "check_seconds", compile_field="check_compile_seconds"):
        _checked(step, config, options, device, args, wrapper, no_sync, result)
    result["part"] = "timing"
    save()
    with timed_phase(phases, "timing_seconds", compile_field="timing_compile_seconds"):
        result.update(_timed(step, device, local, args))


def leave() -> None:
    """Leave the process group once the caller holds no step. A DDP wrapper's reducer holds the
    group too; where the reducer is the group's last holder, freeing it joins gloo's worker
    threads with the GIL held, and a worker still freeing a finished collective's tensors waits
    for that GIL: a deadlock (a CI run on torch 2.13 hung in ~ProcessGroupGloo so). With the step
    freed first, the world's reference is the last, and frees the group with the GIL released."""
    _dist().destroy_process_group()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m optbench.suite.distributed", description=plain(__doc__.split("\n")[0])
    )
    p.add_argument("--size", default="1B")
    p.add_argument("--variant", choices=list(DISTRIBUTED_VARIANTS), default="ddp")
    p.add_argument("--out", help="the result JSON, written by rank 0")
    p.add_argument(
        "--device", choices=["cuda", "cpu"], default=None, help="default: cuda where there is one"
    )
    p.add_argument("--backend", default=None, help="default: nccl on GPUs, gloo on a CPU")
    p.add_argument("--precision", default=None, help="override the baseline's (e.g. fp32 on a CPU)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="per rank; default: the size's single-GPU batch",
    )
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument(
        "--check-batch",
        type=int,
        default=None,
        help="sequences per rank in the gradient check (default: the step's batch per rank)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-ms", type=float, default=2000.0)
    p.add_argument("--rep-ms", type=float, default=1000.0)
    p.add_argument("--min-reps", type=int, default=10)
    p.add_argument(
        "--step-variant",
        default=None,
        help="wrap this models.variants step instead of the variant's own (e.g. foreach-stats)",
    )
    p.add_argument(
        "--compile-scope",
        choices=["blocks", "model"],
        default="blocks",
        help="a compiled step: per block (default, as torchtitan does) or the model whole",
    )
    p.add_argument("--plant", choices=PLANTS, default="none", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


# --- the launcher (the asv side)
# ----------------------------------------------------------------------------


def torchrun_args(
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    endpoint: str | None = None,
    rdzv_id: str = RDZV_ID,
) -> list[str]:
    """torchrun's launch arguments for ``nproc_per_node`` ranks on this host, one of ``nnodes``
    nodes.

    One node: ``--standalone`` (a rendezvous on a free local port). Several: c10d rendezvous at
    ``endpoint`` (``host:port``, the same on every node, as is ``rdzv_id``); node 0 runs on
    ``host`` and hosts the rendezvous store on that port (``is_host=1``), the other nodes connect
    to it. c10d numbers the nodes itself (by address and agent pid), so global rank 0, which
    writes the result, may be on any node; torchrun's ``--node-rank`` is for static rendezvous
    (c10d ignores it) and is not passed. Raises ValueError for several nodes without an endpoint
    or with a node rank outside [0, nnodes)."""
    if nnodes == 1:
        return ["--standalone", f"--nproc-per-node={nproc_per_node}"]
    if endpoint is None or not 0 <= node_rank < nnodes:
        raise ValueError(
            f"{nnodes} nodes need a rendezvous endpoint and a node rank in "
            f"[0, {nnodes}): got {endpoint!r}, {node_rank}"
        )
    return [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf=is_host={int(node_rank == 0)}",
    ]


def torchrun_command(
    nproc_per_node: int,
    out: str | Path,
    *args: str,
    nnodes: int = 1,
    node_rank: int = 0,
    endpoint: str | None = None,
    rdzv_id: str = RDZV_ID,
) -> list[str]:
    """The torchrun command of ``nproc_per_node`` ranks on this host, node ``node_rank`` of
    ``nnodes`` (:func:`torchrun_args`), rank 0 writing ``out``; ``args`` go to the entry point."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *torchrun_args(nproc_per_node, nnodes, node_rank, endpoint, rdzv_id),
        "-m",
        "optbench.suite.distributed",
        "--out",
        str(out),
        *args,
    ]


def launch(
    world: int, *args: str, timeout_s: float | None = None, env: dict[str, str] | None = None
) -> tuple[int, dict[str, Any] | None, str]:
    """Run the entry point under torchrun with ``world`` ranks; (exit status, rank 0's result or
    None, the output's tail). The launch is its own process group, killed whole where this is
    interrupted (a case's timeout: ``optbench.run.runner.CaseTimeout``) or runs past
    ``timeout_s``."""
    with tempfile.TemporaryDirectory(prefix="optbench-dist-") as tmp:
        out = Path(tmp) / "result.json"
        proc = subprocess.Popen(
            torchrun_command(world, out, *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=REPO_ROOT,
        )
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except BaseException as exc:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            stopped = f"torchrun with {world} ranks stopped; {progress(out)}"
            print(f"optbench: {stopped}", file=sys.stderr)
            # the case's record says it too (asv drops a skipped case's stderr); add_note's
            # attribute, set by hand where Python predates it (3.10)
            exc.__notes__ = [*getattr(exc, "__notes__", []), stopped]
            raise
        result = json.loads(out.read_text()) if out.exists() else None
        return proc.returncode, result, output[-4000:]


def progress(out: Path) -> str:
    """How far rank 0 got, from the result it writes after each part (``out``)."""
    return progress_of(json.loads(out.read_text()) if out.exists() else None)


def progress_of(result: dict[str, Any] | None) -> str:
    """How far rank 0 got, by its result so far (None: none written, so it was joining the process
    group): the seconds of the parts it spent (torch.compile's among them; a part that raised
    counts too) and the part it was in, in words."""
    phases = (result or {}).get("phases") or {}
    ended = [
        f"{k.removesuffix('_seconds').replace('_compile', ' (torch.compile)')} {v:.1f} s"
        for k, v in phases.items()
    ]
    inside = (result or {"part": "join"}).get("part")
    return f"rank 0 ended {', '.join(ended) or 'no part'}; it was in: {inside or 'none'}"


# A case launches torchrun, starts every rank (torch, CUDA, NCCL), builds the step and its
# single-process reference, compiles ('-best': twice, the reference and the wrapped step) and times
# ~3 s of steps: more than a single-GPU case's budget (optbench.store.settings' case_budget_s,
# 180 s) on a cold compile cache.
CASE_BUDGET_S = 600.0


def distributed_work(
    size: str,
    variant: str,
    world: int,
    device: str,
    one_gpu: dict[str, float] | None = None,
    extra: tuple[str, ...] = (),
    timeout_s: float | None = None,
) -> Any:
    """The case of ``variant`` at ``world`` GPUs: launches torchrun (the check and the timing run in
    its ranks) and returns a Work whose ``measured`` step is the slowest rank's timing (nothing is
    timed in this process); every rank's timing, tokens/s per GPU and the scaling efficiency go to
    its ``info``. ``one_gpu`` maps a variant to its tokens/s at world size 1 measured earlier in
    this run (filled in here at world size 1): the efficiency at N is tokens/s per GPU at N over
    that, None where this run has no 1-GPU figure. Skips (NotImplementedError) where this machine
    has fewer GPUs than ``world``."""
    from optbench.run.runner import Work

    gpus = _gpus(world, device, extra)
    if gpus < world:
        raise NotImplementedError(f"needs {world} GPU{'s' * (world > 1)}, this machine has {gpus}")
    code, result, tail = launch(
        world, "--size", size, "--variant", variant, *extra, timeout_s=timeout_s
    )
    _raise_unless_ok(world, code, result, tail)
    rate = result["tokens_per_s_per_gpu"]
    one_gpu = {} if one_gpu is None else one_gpu
    if world == 1:
        one_gpu[variant] = rate
    # the timed step's check (DDP) stored beside the eager one
    checked = {**result["check"], "timed_step": result.get("timed_check")}
    return Work(
        timed={},
        check=lambda: checked,
        measured={"step": result["step"]},
        flops={"step": result["flops_per_step_per_gpu"]},
        graph=False,
        info=_info(result, one_gpu.get(variant)),
    )


def _gpus(world: int, device: str, extra: tuple[str, ...]) -> int:
    """The GPUs the ranks can have: this machine's, or ``world`` where ``extra`` puts the ranks on
    the CPU (gloo, the tests)."""
    import torch

    if "--device" in extra and extra[extra.index("--device") + 1] == "cpu":
        return world
    return torch.cuda.device_count() if str(device).startswith("cuda") else 0


def _raise_unless_ok(world: int, code: int | None, result: dict | None, tail: str) -> None:
    """Raise what torchrun's ``result`` (its exit ``code``, the output's ``tail``) means for the
    case where it is not ok: NotImplementedError (skipped), WrongResult (the check failed),
    RuntimeError (no result, or another status or exit)."""
    from optbench.run.runner import WrongResult

    if result is None or "status" not in result:
        raise RuntimeError(
            f"torchrun with {world} ranks exited {code} without a result "
            f"({progress_of(result)}): {tail}"
        )
    if result["status"] == "skipped":
        raise NotImplementedError(result["reason"])
    if result["status"] == "wrong":
        raise WrongResult(result["reason"])
    if result["status"] != "ok" or code != 0:
        raise RuntimeError(
            f"torchrun with {world} ranks exited {code}, status {result['status']}: {tail}"
        )


INFO_KEYS = (  # what a case's info keeps of its ranks' result as they reported it
    "world_size",
    "backend",
    "wrapper",
    "step_variant",
    "options",
    "global_batch",
    "params",
    "slowest_rank",
    "wall_median_ms",
    "device_median_ms",
    "ranks",
    "tokens_per_s_per_gpu",
    "communication",
    "phases",
)


def _info(result: dict[str, Any], one_gpu_rate: float | None) -> dict[str, Any]:
    """A case's ``info`` from its ranks' ``result``, with its scaling efficiency against
    ``one_gpu_rate`` (this run's 1-GPU tokens/s of the variant; None where there is none)."""
    options = result["options"]
    return {
        **{key: result[key] for key in INFO_KEYS},
        "tokens": result["tokens_per_step_per_gpu"],
        "primary_clock": "wall",
        "precision": options["precision"],
        "batch_size": options["batch_size"],
        "seq_len": options["seq_len"],
        "scaling_efficiency": (
            None if one_gpu_rate is None else result["tokens_per_s_per_gpu"] / one_gpu_rate
        ),
        "scaling_note": (
            None if one_gpu_rate is not None else "no 1-GPU figure of this variant in this run"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    return rank_main(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
