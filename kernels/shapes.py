"""Shapes and implementations each kernel op is measured at: plain data, importable without torch.

Shapes are those of the 100M/500M/1B configs (tokens = batch 8 x sequence 1024) and of the
kernel goals (kernels/README.md). The first implementation of each op is its baseline.
"""

SHAPES: dict[str, dict[str, dict[str, int]]] = {
    "rmsnorm": {f"{r}x{h}": {"rows": r, "hidden": h} for r, h in
                [(8192, 768), (8192, 1536), (8192, 2048), (16384, 768), (16384, 2048), (16384, 4096)]},
    # The residual add and the norm after it, at the step's shapes: x fp32 (the stream), y in the op's dtype.
    "add_rmsnorm": {f"{r}x{h}": {"rows": r, "hidden": h} for r, h in [(8192, 768), (8192, 1536), (8192, 2048)]},
    "swiglu": {f"{r}x{i}": {"rows": r, "inter": i} for r, i in
               [(8192, 2048), (8192, 4096), (8192, 5632), (8192, 14336)]},
    "qknorm": {f"{t}x{hq}+{hk}x{dh}": {"tokens": t, "q_heads": hq, "kv_heads": hk, "head_dim": dh}
               for t, hq, hk, dh in [(8192, 12, 4, 64), (8192, 16, 4, 96), (8192, 32, 4, 64)]},
    # RoPE of the packed q/k/v projection at the 100M, 500M and 1B configs' attention (B=8, S=1024).
    "qkv_rope": {f"{t}x{hq}+{hk}x{dh}": {"tokens": t, "q_heads": hq, "kv_heads": hk, "head_dim": dh}
                 for t, hq, hk, dh in [(8192, 12, 4, 64), (8192, 16, 4, 96), (8192, 32, 4, 64)]},
    "linear_ce": {f"{n}x{h}x{v}": {"tokens": n, "hidden": h, "vocab": v} for n, h, v in
                  [(8192, 768, 32000), (8192, 1536, 32000), (8192, 2048, 32000), (8192, 2048, 128256)]},
    "grad_stats": {"100M": {"size_m": 100}, "500M": {"size_m": 500}, "1B": {"size_m": 1000}},
}

IMPLS: dict[str, tuple[str, ...]] = {
    "rmsnorm": ("eager", "compile", "liger", "triton"),
    "add_rmsnorm": ("eager", "compile", "triton"),
    "swiglu": ("eager", "compile", "liger", "triton"),
    "qknorm": ("eager", "compile", "triton"),
    "qkv_rope": ("eager", "compile", "triton"),
    "linear_ce": ("eager", "compile", "chunked", "triton-ce", "triton", "liger-ce", "liger"),
    "grad_stats": ("loop", "foreach"),
}

# The quick suite measures one shape per op: the 1B config's.
QUICK_SHAPES: dict[str, list[str]] = {
    "rmsnorm": ["8192x2048"], "add_rmsnorm": ["8192x2048"], "swiglu": ["8192x5632"], "qknorm": ["8192x32+4x64"],
    "qkv_rope": ["8192x32+4x64"],
    "linear_ce": ["8192x2048x32000"], "grad_stats": ["1B"],
}
