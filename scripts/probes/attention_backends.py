"""Probe: SDPA's attention backends at a model size's attention shape, forward and forward+backward.

Each backend that accepts the call (cuDNN, FlashAttention-2, memory-efficient; ``enable_gqa`` as
the model calls it, and with k and v expanded to every q head as HF does under a mask) is timed
by ``optbench.measure.timing.measure`` (device ms, CUDA graph replays) on q, k, v laid out as the
model makes them ((B, S, H, D) transposed to (B, H, S, D)), and so is SDPA's own choice
('default', what the model gets). TFLOP/s count causal attention's fewest FLOPs
(``optbench.profiling.floors``): 2 B H S^2 D forward, 6 B H S^2 D forward and backward. 'peak' is
the most one forward+backward allocates beyond its inputs (the math kernel's B x H x S x S scores
show there). ``--dtype float32``: the check's fp32 reference step's attention. Run from the
repository root on a GPU:

    python3 -m scripts.probes.attention_backends 1B [--dtype float32]
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from models.config import CONFIGS
from optbench.measure.timing import measure

BACKENDS = {
    "default": None,  # SDPA's own choice
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("size")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    cfg = CONFIGS[args.size]
    b, s, h, hkv, d = args.batch, args.seq, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    g = torch.Generator("cuda").manual_seed(0)

    def heads(n: int) -> torch.Tensor:
        x = torch.randn(b, s, n, d, device="cuda", dtype=dtype, generator=g)
        return x.transpose(1, 2).requires_grad_()

    q, k, v = heads(h), heads(hkv), heads(hkv)
    dy = torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g)
    fwd_flops = 2.0 * b * h * s * s * d
    shape = f"B={b} S={s} Hq={h} Hkv={hkv} D={d} {args.dtype}"
    print(f"{args.size}: {shape}, torch {torch.__version__}")
    for name, backend in BACKENDS.items():
        for layout in ("gqa", "expanded"):

            def attend(layout: str = layout) -> torch.Tensor:
                if layout == "gqa":
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                kk, vv = (t.repeat_interleave(h // hkv, dim=1) for t in (k, v))
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=True)

            def both(attend=attend) -> None:
                q.grad = k.grad = v.grad = None
                attend().backward(dy)

            try:
                with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                    both()
                    torch.cuda.synchronize()
                    held = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    both()
                    peak = torch.cuda.max_memory_allocated() - held
                    fwd = measure(attend, device="cuda").device
                    fb = measure(both, device="cuda").device
            except RuntimeError as exc:
                print(f"  {name:9} {layout:8} not available: {str(exc).splitlines()[0][:100]}")
                continue
            print(
                f"  {name:9} {layout:8} fwd {fwd.median_ms:7.3f} ms "
                f"({fwd_flops / fwd.median_ms / 1e9:5.0f} TFLOP/s)  fwd+bwd {fb.median_ms:7.3f} ms "
                f"({3 * fwd_flops / fb.median_ms / 1e9:5.0f} TFLOP/s)  peak {peak / 2**20:7.0f} MiB"
            )


if __name__ == "__main__":
    main()
