"""Probe (CUDA, needs transformers): HF Llama + torch.compile step (what a user would pick), B8
S1024 bf16.

optbench's copy of hf_compile_step.py (``../shared/anchors/``, beside the repository), changed in
one way only: after the 3 compile steps it runs steps for 2 s (the GPU reaches its power cap) and
then times as many steps as fill >= 1 s (at least 10), as optbench times its own steps since
2361e8b. Sizes from $ANCHOR_SIZES (default all); one JSON line per size, and all of them in
$OUT/anchors-steady.json (default /tmp). Its shapes are the anchor's (tests/test_anchors.py checks
optbench.suite.anchors against ``cfgs``, ``B, S`` and ``LlamaConfig`` here).

Run from the repository root: ``python3 -m scripts.probes.hf_compile_step_steady``. Output of its
runs (H100): results/h100-sxm/anchors/2026-11-24c-hf-compile-steady/ and
results/h100-sxm/anchors/2026-11-24d-hf-compile-steady/.
"""

import json
import os
import time
import traceback

import torch

cfgs = {
    "100M": dict(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
    ),
    "500M": dict(
        hidden_size=1536,
        intermediate_size=4096,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=4,
    ),
    "1B": dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
    ),
}
B, S = 8, 1024


def measure_size(size: str, kw: dict, dev: torch.device) -> dict:
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama as m

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, max_position_embeddings=S, tie_word_embeddings=False, **kw)
    cfg._attn_implementation = "sdpa"
    model = m.LlamaForCausalLM(cfg).to(dev)
    n = sum(p.numel() for p in model.parameters())
    n_emb = model.model.embed_tokens.weight.numel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    cmodel = torch.compile(model)
    x = torch.randint(0, 32000, (B, S), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = cmodel(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    ct = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    w0 = time.time()
    while time.time() - w0 < 2.0:
        step()
    torch.cuda.synchronize()
    t_step = time.time()
    step()
    torch.cuda.synchronize()
    t_step = time.time() - t_step
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    k = max(10, int(1.0 / t_step) + 1)
    for _ in range(k):
        step()
    e1.record()
    torch.cuda.synchronize()
    ms = e0.elapsed_time(e1) / k
    tok_s = B * S / ms * 1e3
    L, Hd = kw["num_hidden_layers"], kw["hidden_size"]
    mfu = (6 * (n - n_emb) + 12 * L * Hd * S) * tok_s / 989e12
    r = dict(
        size=size,
        variant="hf_compile_steady",
        timed_steps=k,
        step_ms=round(ms, 2),
        tok_s=round(tok_s),
        mfu_vs_989=round(mfu, 3),
        peak_GB=round(torch.cuda.max_memory_allocated() / 2**30, 2),
        compile_s=round(ct, 1),
    )
    return r


def main() -> None:
    dev = torch.device("cuda")
    rows = []
    for size, kw in cfgs.items():
        if size not in os.environ.get("ANCHOR_SIZES", "100M 500M 1B").split():
            continue
        try:
            r = measure_size(size, kw, dev)
            print(json.dumps(r), flush=True)
            rows.append(r)
        except Exception as e:
            print(size, repr(e)[:300])
            traceback.print_exc()
        # the size's model, optimizer and compiled graphs went with measure_size's frame
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "anchors-steady.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
