"""Probe (H100): what fusing the q/k/v and gate/up projections and the SDPA backend would move at 1B/500M.

Times forward+backward of (a) q, k, v as three Linear layers vs one fused Linear, (b) gate, up as two vs one,
(c) SDPA causal GQA attention with each available backend, by optbench.timing.measure (bf16, B=8, S=1024).
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from models.config import CONFIGS
from optbench.timing import measure

size = sys.argv[1] if len(sys.argv) > 1 else "1B"
cfg = CONFIGS[size]
B, S, d, hd = 8, 1024, cfg.d_model, cfg.head_dim
dev, dt = "cuda", torch.bfloat16
x = torch.randn(B * S, d, device=dev, dtype=dt, requires_grad=True)


def row(name, t, flops=None):
    r = {"size": size, "case": name, "device_ms": round(t.device.median_ms, 4), "iqr_ms": round(t.device.iqr_ms, 4)}
    if flops:
        r["TFLOP_s"] = round(flops / t.device.median_ms / 1e9, 1)
    print(json.dumps(r), flush=True)


def fwd_bwd(weights):
    def fn():
        outs = [x @ w.t() for w in weights]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return fn


def linear_case(name, out_dims):
    ws = [(torch.randn(n, d, device=dev, dtype=dt) * 0.02).requires_grad_() for n in out_dims]
    fused = [(torch.cat([w.detach() for w in ws])).requires_grad_()]
    flops = 6 * B * S * d * sum(out_dims)
    row(f"{name}-separate", measure(fwd_bwd(ws), device=dev), flops)
    row(f"{name}-fused", measure(fwd_bwd(fused), device=dev), flops)


linear_case("qkv", [cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.n_kv_heads * hd])
linear_case("gate_up", [cfg.ffn_dim, cfg.ffn_dim])

q = torch.randn(B, cfg.n_heads, S, hd, device=dev, dtype=dt, requires_grad=True)
k = torch.randn(B, cfg.n_kv_heads, S, hd, device=dev, dtype=dt, requires_grad=True)
v = torch.randn(B, cfg.n_kv_heads, S, hd, device=dev, dtype=dt, requires_grad=True)
att_flops = 3.5 * 4 * B * cfg.n_heads * S * S * hd / 2  # causal fwd (2 matmuls) + bwd (2.5x)
for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
    def att(backend=backend):
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        o.backward(torch.ones_like(o))
    try:
        row(f"sdpa-{backend.name}", measure(att, device=dev), att_flops)
    except Exception as exc:  # a backend that cannot take these shapes
        print(json.dumps({"size": size, "case": f"sdpa-{backend.name}", "error": repr(exc)[:200]}), flush=True)
