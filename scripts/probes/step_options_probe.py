"""Time training steps of given StepOptions overrides (B8 S1024 bf16) with optbench's timer; one JSON line each."""
import json, os, sys, time
import torch
from models.config import CONFIGS
from models.step import BASELINE, build_step
from optbench.timing import measure

size = sys.argv[1]
for spec in sys.argv[2:]:
    name, _, kv = spec.partition(":")
    over = {}
    for item in kv.split(","):
        k, v = item.split("=")
        over[k] = {"true": True, "false": False}.get(v, v)
    t0 = time.time()
    step = build_step(CONFIGS[size], BASELINE.replace(**over), "cuda", 0)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    build_s = time.time() - t0
    rep_ms = float(os.environ.get("PROBE_REP_MS", "100"))  # 100: the suite's default
    m = measure(step, device="cuda", graph=False, rep_ms=rep_ms, max_reps=1000).to_dict()
    w, d = m["wall"], m["device"]
    print(json.dumps({"size": size, "name": name, "options": over, "build_compile_s": round(build_s, 1),
                      "wall_ms": w["median_ms"], "wall_iqr": w.get("iqr_ms"), "device_ms": d and d["median_ms"],
                      "n": len(w.get("samples_ms", [])), "samples": w.get("samples_ms"), "date": time.strftime("%Y-%m-%dT%H:%M:%S")}), flush=True)
    del step
    torch.cuda.empty_cache()
