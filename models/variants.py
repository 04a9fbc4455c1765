"""Which step variants each benchmark grid measures: plain data, importable without torch.

A variant is one optimization switched on from the eager baseline (``models.step.VARIANTS``);
'eager' is the baseline itself and 'best' our best combination.
"""

SWITCHES = [
    "triton-norm", "liger-norm", "triton-swiglu", "liger-swiglu", "triton-qknorm",
    "chunked-ce", "fused-ce", "liger-flce", "checkpoint", "foreach-stats", "foreach-adamw", "fused-adamw",
    "no-item-sync", "cached-mask", "sdpa-causal", "cuda-graph",
]
COMPILE_MODES = ["compile-default", "compile-reduce-overhead", "compile-max-autotune",
                 "compile-max-autotune-no-cudagraphs"]

STEP_VARIANTS: dict[str, list[str]] = {
    # What a CPU runs (Triton through the interpreter is too slow for a timed step).
    "tiny": ["eager", "chunked-ce", "checkpoint", "foreach-stats", "foreach-adamw", "no-item-sync",
             "cached-mask", "sdpa-causal"],
    "quick": ["eager", "triton-norm", "triton-swiglu", "fused-ce", "liger-flce", "foreach-stats",
              "fused-adamw", "no-item-sync", "sdpa-causal", "cuda-graph", "compile-default", "best"],
    "100M": ["eager", *SWITCHES, *COMPILE_MODES, "best"],
    "500M": ["eager", *SWITCHES, "compile-default", "best"],
    "1B": ["eager", *SWITCHES, "compile-default", "best"],
    # bench_precision: fp32 with TF32 off/on, bf16 autocast (the baseline), fp16 autocast + GradScaler.
    "precision": ["fp32", "tf32", "eager", "fp16-scaler"],
}
