"""The HuggingFace + torch.compile anchor: the step a user of HF would time, built and timed as our
own step is.

``bench_anchors.HFCompileStep`` times transformers' ``LlamaForCausalLM`` at the shapes of our sizes
(``models.config.CONFIGS``) with its users' setup (:data:`HF_SETUP`), through the same runner, timer
and record as ``bench_step`` (samples, median, IQR, gpu_state), so that "x HF" is one median over
another from one store. The HF model is not ours, so it is not checked parameter by parameter
against our step:
:func:`check_training` refuses a step that does not train. Importable without torch (asv reads the
grid).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from optbench.run.runner import Work, WrongResult

if TYPE_CHECKING:
    from torch import Tensor

    from models.config import ModelConfig

ANCHOR_LR = 1e-4  # the anchor script's AdamW learning rate
HF_SETUP = (
    "transformers LlamaForCausalLM (SDPA attention, untied LM head), torch.compile(model) in its "
    f"default mode, torch AdamW(fused=True, lr={ANCHOR_LR:g}), bf16 autocast, our baseline's batch "
    "and sequence length"
)
CHECK_STEPS = 3  # optimizer steps on the repeated batch before timing
# At init the model guesses near-uniformly: loss ~ ln(vocab). HF initializes weights with std 0.02,
# so the logits have a std of ~0.02 sqrt(d_model) (0.9 at 1B), which adds ~var/2 <= 0.5 nats (5% of
# ln 32000).
INIT_LOSS_RTOL = 0.1
# Least relative fall of the loss over the check's steps: ten times bf16's run-to-run noise on the
# loss (<= 7e-5 between our step's variants, H100, 500M) and far below what AdamW at lr 1e-4 does to
# it (~4% a step at 500M).
LOSS_DROP_RTOL = 1e-3


def hf_shape(cfg: ModelConfig) -> dict[str, int]:
    """``LlamaConfig`` keywords of the shape of ``cfg`` (the rest stays at HF's defaults, as in the
    anchor script)."""
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
    }


def check_training(
    step: Callable[[], Tensor],
    params: Mapping[str, Tensor],
    vocab_size: int,
    n_params: int,
    steps: int = CHECK_STEPS,
) -> dict[str, Any]:
    """Run ``steps`` calls of ``step`` (one optimizer step on a fixed batch; returns the loss at the
    weights before it) and raise WrongResult unless the step trains: ``params`` (name -> tensor)
    hold ``n_params`` elements (the size's shape), every loss is finite, the first is within
    INIT_LOSS_RTOL of ln(vocab_size), the last is lower than the first by more than LOSS_DROP_RTOL
    of it, and every parameter changed. Returns the losses and counts for the record."""
    import torch

    count = sum(p.numel() for p in params.values())
    before = {name: p.detach().to("cpu", copy=True) for name, p in params.items()}
    losses = [float(step()) for _ in range(steps)]
    unchanged = [name for name, p in params.items() if torch.equal(p.detach().cpu(), before[name])]
    init = math.log(vocab_size)
    problems = []
    if count != n_params:
        problems.append(f"{count} parameters, not the size's {n_params}")
    if not all(map(math.isfinite, losses)):
        problems.append("a loss is not finite")
    elif abs(losses[0] - init) > INIT_LOSS_RTOL * init:
        problems.append(
            f"the first loss is not within {INIT_LOSS_RTOL:.0%} of ln({vocab_size}) = {init:.3f}"
        )
    elif not losses[-1] < losses[0] * (1 - LOSS_DROP_RTOL):
        problems.append(
            f"{steps - 1} optimizer steps on one batch did not lower the loss by "
            f"{LOSS_DROP_RTOL:g} of it"
        )
    if unchanged:
        problems.append(f"{len(unchanged)} parameters did not change (e.g. {unchanged[0]})")
    result = {
        "losses": losses,
        "ln_vocab": init,
        "params": count,
        "unchanged_params": len(unchanged),
    }
    if problems:
        raise WrongResult(f"the step does not train: {'; '.join(problems)}; {result}")
    return result


def hf_step_work(size: str, device: str, seed: int = 0) -> Work:
    """The HF + torch.compile training step of ``size`` at our baseline's batch and sequence length
    on this machine (``optbench.suite.baseline.base_options``): checked with :func:`check_training`,
    then timed as ``optbench.suite.workloads.step_work`` times ours (wall ms per step,
    ``step_timing``; forward + loss; peak memory of a step). Skips (NotImplementedError) where
    ``optbench.suite.plan.anchor_skip_reason`` says the machine cannot run it, or where transformers
    is not installed."""
    import torch

    from models.config import CONFIGS, flops_per_token, param_count
    from optbench.suite.baseline import base_options
    from optbench.suite.plan import anchor_skip_reason
    from optbench.suite.workloads import machine_profile, skip_if, step_timing

    profile = machine_profile(device)
    skip_if(anchor_skip_reason(profile, size))
    skip_if(
        None if find_spec("transformers") else "not installed: the HF anchor needs transformers"
    )
    import transformers
    from transformers.models.llama import modeling_llama

    cfg, base = CONFIGS[size], base_options(profile, size)
    torch.manual_seed(seed)  # the model init
    hf_cfg = transformers.LlamaConfig(
        max_position_embeddings=base.seq_len, tie_word_embeddings=False, **hf_shape(cfg)
    )
    hf_cfg._attn_implementation = "sdpa"
    model = modeling_llama.LlamaForCausalLM(hf_cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=ANCHOR_LR, fused=True)
    compiled = torch.compile(model)  # compiled on its first call, for the one shape it runs
    gen = torch.Generator(device).manual_seed(seed)
    batch = torch.randint(
        0, cfg.vocab_size, (base.batch_size, base.seq_len), generator=gen, device=device
    )

    def forward_loss() -> Tensor:
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            return compiled(input_ids=batch, labels=batch).loss

    def step() -> Tensor:
        loss = forward_loss()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def check() -> dict[str, Any]:
        return check_training(
            step, dict(model.named_parameters()), cfg.vocab_size, param_count(cfg)
        )

    tokens = base.batch_size * base.seq_len
    info = {
        "tokens": tokens,
        "primary_clock": "wall",
        "precision": "bf16",
        "batch_size": base.batch_size,
        "seq_len": base.seq_len,
        "params": param_count(cfg),
        "setup": HF_SETUP,
        "transformers": transformers.__version__,
    }
    return Work(
        timed={"step": step, "forward": lambda: forward_loss().detach()},
        check=check,
        memory=("step",),
        flops={"step": flops_per_token(cfg, base.seq_len) * tokens},
        graph=False,
        timing=step_timing(device, info),
        info=info,
    )
