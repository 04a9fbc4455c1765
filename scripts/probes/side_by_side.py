import json, sys, time
from functools import partial
from optbench.runner import Case, run_grid
from optbench.store import ResultStore
from optbench.workloads import step_work
t0 = time.time()
size = sys.argv[1]
for variant in sys.argv[2:]:
    recs = run_grid(f"bench_step.Step{size}", [Case({"variant": variant}, partial(step_work, size, variant, "cuda"))], store=ResultStore("/tmp/side"))
    for k, r in recs.items():
        m = (r.get("metrics") or {}).get("step", {})
        print(json.dumps({"key": k, "status": r["status"], "check_seconds": r.get("check_seconds"), "step_wall": (m.get("wall") or {}).get("median_ms"), "step_wall_iqr": (m.get("wall") or {}).get("iqr_ms"), "step_device": (m.get("device") or {}).get("median_ms"), "seconds": round(time.time() - t0, 1)}), flush=True)
