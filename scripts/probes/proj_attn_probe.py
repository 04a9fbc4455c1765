"""Probe (CUDA): what fusing the q/k/v and gate/up projections and the SDPA backend would move at
one size.

Times forward+backward of (a) q, k, v as three Linear layers vs one fused Linear, (b) gate, up as
two vs one, (c) SDPA causal GQA attention with each available backend, by
optbench.measure.timing.measure (bf16, B=8, S=1024). Prints one JSON line per case.

Run from the repository root: ``python3 -m scripts.probes.proj_attn_probe 1B`` (also 500M, 100M).
Output of its 2026-11-24 run (H100): results/h100-sxm/fused-proj-probe-2026-11-24/probe.jsonl.
"""

import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from models.config import CONFIGS
from optbench.measure.timing import measure

B, S = 8, 1024
DEVICE, DTYPE = "cuda", torch.bfloat16


def row(size, name, t, flops=None):
    r = {
        "size": size,
        "case": name,
        "device_ms": round(t.device.median_ms, 4),
        "iqr_ms": round(t.device.iqr_ms, 4),
    }
    if flops:
        r["TFLOP_s"] = round(flops / t.device.median_ms / 1e9, 1)
    print(json.dumps(r), flush=True)


def fwd_bwd(x, weights):
    def fn():
        outs = [x @ w.t() for w in weights]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    return fn


def linear_case(size, x, name, out_dims):
    d = x.shape[-1]
    ws = [(torch.randn(n, d, device=DEVICE, dtype=DTYPE) * 0.02).requires_grad_() for n in out_dims]
    fused = [(torch.cat([w.detach() for w in ws])).requires_grad_()]
    flops = 6 * B * S * d * sum(out_dims)
    row(size, f"{name}-separate", measure(fwd_bwd(x, ws), device=DEVICE), flops)
    row(size, f"{name}-fused", measure(fwd_bwd(x, fused), device=DEVICE), flops)


def attention(q, k, v, backend):
    def fn():
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        o.backward(torch.ones_like(o))

    return fn


def main(size: str) -> None:
    cfg = CONFIGS[size]
    d, hd = cfg.d_model, cfg.head_dim
    x = torch.randn(B * S, d, device=DEVICE, dtype=DTYPE, requires_grad=True)
    linear_case(size, x, "qkv", [cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.n_kv_heads * hd])
    linear_case(size, x, "gate_up", [cfg.ffn_dim, cfg.ffn_dim])

    q = torch.randn(B, cfg.n_heads, S, hd, device=DEVICE, dtype=DTYPE, requires_grad=True)
    k = torch.randn(B, cfg.n_kv_heads, S, hd, device=DEVICE, dtype=DTYPE, requires_grad=True)
    v = torch.randn(B, cfg.n_kv_heads, S, hd, device=DEVICE, dtype=DTYPE, requires_grad=True)
    att_flops = 3.5 * 4 * B * cfg.n_heads * S * S * hd / 2  # causal fwd (2 matmuls) + bwd (2.5x)
    for backend in (
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
    ):
        try:
            row(
                size,
                f"sdpa-{backend.name}",
                measure(attention(q, k, v, backend), device=DEVICE),
                att_flops,
            )
        except Exception as exc:  # a backend that cannot take these shapes
            print(
                json.dumps(
                    {"size": size, "case": f"sdpa-{backend.name}", "error": repr(exc)[:200]}
                ),
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "1B")
