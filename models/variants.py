"""The training step's variants and which ones each benchmark grid measures: plain data, importable
without torch (asv reads the grids in processes that never need torch).

A variant is one optimization switched on from the eager baseline ``models.step.BASELINE``;
'eager' is the baseline itself and 'best' our best combination.
"""

# The compiled-and-graphed best combinations, each one change on top of the one before.
_COMPILE_GRAPH = {"grad_stats": "foreach", "optimizer": "fused", "item_sync": False, "attn_mask": "is_causal",
                  "compile": "default", "cuda_graph": True}
_MASTER = {**_COMPILE_GRAPH, "optimizer": "master"}
_FUSED = {**_MASTER, "fused_proj": True}

# Name -> the StepOptions overrides that turn one optimization on. An optional "baseline" entry holds
# overrides applied to both sides, i.e. the reference the switch is measured against (see variant_options):
# tf32 against fp32; triton-qknorm against an eager QK-norm model; cuda-graph against a step that already
# has its prerequisites (capturable fused AdamW, no item sync, is_causal), so only the graph is measured.
VARIANTS: dict[str, dict] = {
    "fp32": {"precision": "fp32"},  # a de-optimization: fp32 against the bf16-autocast baseline
    "tf32": {"precision": "tf32", "baseline": {"precision": "fp32"}},
    "fp16-scaler": {"precision": "fp16"},
    "triton-norm": {"norm": "triton"},
    "triton-swiglu": {"mlp": "triton"},
    "triton-qknorm": {"qk_norm": "triton", "baseline": {"qk_norm": "eager"}},
    "liger-norm": {"norm": "liger"},
    "liger-swiglu": {"mlp": "liger"},
    "chunked-ce": {"loss": "chunked"},
    "fused-ce": {"loss": "fused"},
    "liger-flce": {"loss": "liger"},
    "checkpoint": {"checkpoint_every": 1},
    "foreach-stats": {"grad_stats": "foreach"},
    "foreach-adamw": {"optimizer": "foreach"},
    "fused-adamw": {"optimizer": "fused"},
    "adamw-8bit": {"optimizer": "adamw8bit"},
    "master-adamw": {"optimizer": "master"},  # bf16 weights, fp32 masters in our one-pass Triton AdamW
    "no-item-sync": {"item_sync": False},
    "cached-mask": {"attn_mask": "cached"},
    "sdpa-causal": {"attn_mask": "is_causal"},
    "fused-proj": {"fused_proj": True},  # one GEMM for q, k, v and one for gate, up
    # RoPE in Triton out of the packed q/k/v projection, against the eager RoPE of the same fused model.
    "triton-rope": {"rope": "triton", "baseline": {"fused_proj": True}},
    "cuda-graph": {"cuda_graph": True,
                   "baseline": {"optimizer": "fused", "item_sync": False, "attn_mask": "is_causal"}},
    "compile-default": {"compile": "default"},
    "compile-reduce-overhead": {"compile": "reduce-overhead"},
    "compile-max-autotune": {"compile": "max-autotune"},
    "compile-max-autotune-no-cudagraphs": {"compile": "max-autotune-no-cudagraphs"},
    # Regional compilation: each block compiled on its own (one graph shared by all but the first), not the model.
    "compile-regional": {"compile": "default", "compile_scope": "blocks"},
    # Our best combinations, three ways: Triton kernels + our fused linear CE under torch.compile; inductor's
    # own fusions of the eager model; Triton kernels in one captured CUDA graph (no compile time).
    "best": {"precision": "bf16", "norm": "triton", "mlp": "triton", "loss": "fused", "grad_stats": "foreach",
             "optimizer": "fused", "item_sync": False, "attn_mask": "is_causal", "compile": "default"},
    "best-inductor": {"grad_stats": "foreach", "optimizer": "fused", "item_sync": False, "attn_mask": "is_causal",
                      "compile": "default"},
    "best-graph": {"norm": "triton", "mlp": "triton", "loss": "fused", "grad_stats": "foreach", "optimizer": "fused",
                   "item_sync": False, "attn_mask": "is_causal", "cuda_graph": True},
    # inductor's fusions and no host in the loop: the compiled forward/backward and the optimizer in one graph.
    "best-compile-graph": _COMPILE_GRAPH,
    # best-compile-graph with bf16 weights and our AdamW over fp32 masters (no weight or gradient casts).
    "best-master": _MASTER,
    # best-master with the fused projections: fewer, larger GEMMs (the small k/v projections run slowest).
    "best-fused": _FUSED,
    # best-fused with our Triton kernels: the RMSNorm adds the residual in its pass and, backward, writes the
    # residual gradient in fp32 and bf16 at once (inductor casts it in a pass of its own); SwiGLU and RoPE read
    # the packed gate/up and q/k/v outputs in place and write their gradients in one piece (inductor
    # concatenates the parts' gradients in passes of their own). Our best at every size since 0ba10f3.
    "best-kernels": {**_FUSED, "norm": "triton", "mlp": "triton", "rope": "triton"},
    # best-compile-graph with regional compilation: compile time that does not grow with depth.
    "best-regional": {**_COMPILE_GRAPH, "compile_scope": "blocks"},
}


SWITCHES = [
    "triton-norm", "liger-norm", "triton-swiglu", "liger-swiglu", "triton-qknorm",
    "chunked-ce", "fused-ce", "liger-flce", "checkpoint", "foreach-stats", "foreach-adamw", "fused-adamw",
    "adamw-8bit", "master-adamw", "no-item-sync", "cached-mask", "sdpa-causal", "fused-proj", "triton-rope",
    "cuda-graph",
]
# 'best' last: at 61d5c0a it lost the CUDA context at 500M and 1B, and a lost context ends its grid.
BEST = ["best-inductor", "best-graph", "best-compile-graph", "best-master", "best-fused", "best-kernels",
        "best-regional", "best"]
COMPILE_MODES = ["compile-default", "compile-regional", "compile-reduce-overhead", "compile-max-autotune",
                 "compile-max-autotune-no-cudagraphs"]

STEP_VARIANTS: dict[str, list[str]] = {
    # What a CPU runs (Triton through the interpreter is too slow for a timed step).
    "tiny": ["eager", "chunked-ce", "checkpoint", "foreach-stats", "foreach-adamw", "no-item-sync",
             "cached-mask", "sdpa-causal", "fused-proj"],
    # The quick suite: the switches of our best combinations, one at a time, and the two best combinations
    # with the fewest compiles (inductor's alone, and ours); three compiled cases in all.
    "quick": ["eager", "triton-norm", "triton-swiglu", "fused-ce", "foreach-stats", "fused-adamw", "master-adamw",
              "no-item-sync", "sdpa-causal", "fused-proj", "cuda-graph", "compile-default", "best-compile-graph",
              "best-kernels"],
    # The max-autotune modes last: their autotuning can take minutes on a cold cache.
    "100M": ["eager", *SWITCHES, *BEST, *COMPILE_MODES],
    "500M": ["eager", *SWITCHES, "compile-default", "compile-regional", *BEST],
    "1B": ["eager", *SWITCHES, "compile-default", "compile-regional", *BEST],
    # bench_precision: fp32 with TF32 off/on, bf16 autocast (the baseline), fp16 autocast + GradScaler.
    "precision": ["fp32", "tf32", "eager", "fp16-scaler"],
}
