"""Probe (CUDA): sweep of the master-weights AdamW pass's launch shape at a model's parameter set.

Times one whole optimizer pass (every parameter tensor, as MasterAdamW.step launches them) by
optbench.measure.timing.measure (CUDA-graph replay + events), for block sizes, warps and cache
hints; beside it torch's fused AdamW over fp32 weights and gradients (32 bytes/param) and a 1 GiB
device copy (ceiling). Checks each variant against kernels.adamw.adamw_reference in float64 on one
odd-sized tensor first. Prints one JSON line per variant.

Run from the repository root: ``python3 -m scripts.probes.adamw_sweep 1B``. Output of its 2026-11-24
run (H100): results/h100-sxm/adamw-sweep-2026-11-24/ (``sweep-*.log``; that run's per-program
sum-of-squares buffer was sized for 2048-element blocks and stopped the sweep at block 1024: each
launch shape now gets a buffer of its own).
"""

import json
import sys
from functools import partial

import torch
import triton
import triton.language as tl

from kernels.adamw import MasterAdamW, adamw_reference
from models.config import CONFIGS
from models.model import Decoder
from optbench.measure.timing import measure


@triton.jit
def _kernel(
    MASTER,
    GRAD,
    EXP_AVG,
    EXP_AVG_SQ,
    WEIGHT,
    SCALARS,
    SUMSQ,
    n,
    lr_decay,
    beta1,
    beta2,
    eps,
    BLOCK: tl.constexpr,
    HINT: tl.constexpr,
    NORM: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    inv_grad_scale = tl.load(SCALARS)
    step_size = tl.load(SCALARS + 1)
    inv_sqrt_bias2 = tl.load(SCALARS + 2)
    if HINT:
        p = tl.load(MASTER + offs, mask=mask, other=0.0, eviction_policy="evict_first")
        g = (
            tl.load(GRAD + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            * inv_grad_scale
        )
        m = tl.load(EXP_AVG + offs, mask=mask, other=0.0, eviction_policy="evict_first")
        v = tl.load(EXP_AVG_SQ + offs, mask=mask, other=0.0, eviction_policy="evict_first")
    else:
        p = tl.load(MASTER + offs, mask=mask, other=0.0)
        g = tl.load(GRAD + offs, mask=mask, other=0.0).to(tl.float32) * inv_grad_scale
        m = tl.load(EXP_AVG + offs, mask=mask, other=0.0)
        v = tl.load(EXP_AVG_SQ + offs, mask=mask, other=0.0)
    if NORM:
        tl.store(SUMSQ + pid, tl.sum(p * p, axis=0))
    m = m + (1.0 - beta1) * (g - m)
    v = beta2 * v + (1.0 - beta2) * g * g
    p = p * lr_decay - step_size * m / (tl.sqrt(v) * inv_sqrt_bias2 + eps)
    if HINT:
        tl.store(MASTER + offs, p, mask=mask, cache_modifier=".cs")
        tl.store(EXP_AVG + offs, m, mask=mask, cache_modifier=".cs")
        tl.store(EXP_AVG_SQ + offs, v, mask=mask, cache_modifier=".cs")
        tl.store(WEIGHT + offs, p.to(WEIGHT.dtype.element_ty), mask=mask, cache_modifier=".cs")
    else:
        tl.store(MASTER + offs, p, mask=mask)
        tl.store(EXP_AVG + offs, m, mask=mask)
        tl.store(EXP_AVG_SQ + offs, v, mask=mask)
        tl.store(WEIGHT + offs, p.to(WEIGHT.dtype.element_ty), mask=mask)


def sumsq_buffer(opt, block):
    """The per-program sum-of-squares buffer of one pass over ``opt``'s tensors in ``block``-element
    programs."""
    return torch.zeros(
        sum(triton.cdiv(master.numel(), block) for master in opt.masters), device="cuda"
    )


def run_pass(opt, block, warps, hint, norm, sumsq):
    start = 0
    for p, master, m, v in zip(opt.params, opt.masters, opt.exp_avgs, opt.exp_avg_sqs):
        n = master.numel()
        programs = triton.cdiv(n, block)
        _kernel[(programs,)](
            master,
            p.grad,
            m,
            v,
            p,
            opt._scalars,
            sumsq[start:],
            n,
            1 - 1e-5,
            0.9,
            0.999,
            1e-8,
            BLOCK=block,
            HINT=hint,
            NORM=norm,
            num_warps=warps,
        )
        start += programs


def check(block, warps, hint):
    n = 1_000_003
    gen = torch.Generator("cuda").manual_seed(block + warps)
    master = torch.randn(n, device="cuda", generator=gen)
    grad = torch.randn(n, device="cuda", generator=gen).bfloat16()
    m = torch.randn(n, device="cuda", generator=gen) * 1e-3
    v = torch.rand(n, device="cuda", generator=gen) * 1e-6
    weight = torch.full((n,), float("nan"), device="cuda", dtype=torch.bfloat16)
    ref = [t.double().clone() for t in (master, m, v)]
    scalars = torch.tensor([1.0, 1e-4 / (1 - 0.9), (1 - 0.999) ** -0.5], device="cuda")
    sumsq = torch.zeros(triton.cdiv(n, block), device="cuda")
    _kernel[(triton.cdiv(n, block),)](
        master,
        grad,
        m,
        v,
        weight,
        scalars,
        sumsq,
        n,
        1 - 1e-4 * 0.1,
        0.9,
        0.999,
        1e-8,
        BLOCK=block,
        HINT=hint,
        NORM=True,
        num_warps=warps,
    )
    adamw_reference(
        ref[0],
        grad,
        ref[1],
        ref[2],
        step=1,
        lr=1e-4,
        weight_decay=0.1,
        betas=(0.9, 0.999),
        eps=1e-8,
    )
    errs = [float((a.double() - b).norm() / b.norm()) for a, b in zip((master, m, v), ref)]
    errs.append(float((weight.double() - ref[0]).norm() / ref[0].norm()))
    return max(errs)


def main():
    size = sys.argv[1] if len(sys.argv) > 1 else "1B"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Decoder(CONFIGS[size])
    linear = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    opt = MasterAdamW(model.parameters(), linear, lr=1e-4, weight_decay=0.1)
    for p in opt.params:
        p.grad = (torch.randn_like(p, dtype=torch.float32) * 1e-3).to(p.dtype)
    n = sum(p.numel() for p in opt.params)
    # bf16 weight: reads g 2, p m v 12; writes p m v 12, copy 2. fp32 weight: g 4, no copy
    bytes_ = 28 * n
    rows = []

    def report(name, t, nbytes, err=None):
        d = t.device
        row = {
            "variant": name,
            "median_ms": round(d.median_ms, 4),
            "iqr_ms": round(d.iqr_ms, 4),
            "method": d.method,
            "TB_s": round(nbytes / d.median_ms / 1e9, 3),
            "max_rel_err": err,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)

    buf = torch.empty(2**28, device="cuda")  # 1 GiB
    dst = torch.empty_like(buf)
    report("copy-1GiB", measure(partial(dst.copy_, buf), device="cuda"), 2 * buf.numel() * 4)
    del buf, dst
    report("ours-current(MasterAdamW.step)", measure(opt.step, device="cuda"), bytes_)
    for block, warps, hint in [
        (2048, 8, False),
        (1024, 4, False),
        (4096, 8, False),
        (4096, 16, False),
        (8192, 16, False),
        (2048, 8, True),
        (4096, 8, True),
        (1024, 8, False),
        (512, 4, False),
    ]:
        err = check(block, warps, hint)
        t = measure(
            partial(run_pass, opt, block, warps, hint, True, sumsq_buffer(opt, block)),
            device="cuda",
        )
        report(f"block{block}-warps{warps}{'-hint' if hint else ''}", t, bytes_, err)
    t = measure(
        partial(run_pass, opt, 2048, 8, False, False, sumsq_buffer(opt, 2048)), device="cuda"
    )
    report("block2048-warps8-no-param-norm (diagnostic)", t, bytes_)
    # one flat launch over the same element count (diagnostic: the per-tensor launches' cost)
    flat = [
        torch.randn(n, device="cuda"),
        torch.randn(n, device="cuda"),
        torch.rand(n, device="cuda"),
    ]
    fg = torch.randn(n, device="cuda").bfloat16()
    fw = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    sums = torch.zeros(triton.cdiv(n, 2048), device="cuda")
    flat_pass = partial(
        _kernel[(triton.cdiv(n, 2048),)],
        flat[0],
        fg,
        flat[1],
        flat[2],
        fw,
        opt._scalars,
        sums,
        n,
        1 - 1e-5,
        0.9,
        0.999,
        1e-8,
        BLOCK=2048,
        HINT=False,
        NORM=True,
        num_warps=8,
    )
    report("flat-one-launch-block2048 (diagnostic)", measure(flat_pass, device="cuda"), n * 30)
    del flat_pass
    del flat, fg, fw
    # torch's fused AdamW over fp32 weights and grads of the same shapes (what best-compile-graph
    # runs)
    ps = [torch.nn.Parameter(m.detach().clone()) for m in opt.masters]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    del opt, model
    torch_opt = torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.1, fused=True)
    report("torch-fused-adamw-fp32", measure(torch_opt.step, device="cuda"), n * 28)
    print(
        json.dumps(
            {
                "size": size,
                "params": n,
                "tensors": len(ps),
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "triton": triton.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
