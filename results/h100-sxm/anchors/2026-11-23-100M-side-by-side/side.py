import json, time
from functools import partial
from optbench.runner import Case, run_grid
from optbench.store import ResultStore
from optbench.workloads import step_work
t0 = time.time()
recs = run_grid("bench_step.Step100M", [Case({"variant": "best-compile-graph"}, partial(step_work, "100M", "best-compile-graph", "cuda"))], store=ResultStore("/tmp/side"))
for k, r in recs.items():
    m = r.get("metrics", {}).get("step", {})
    print(json.dumps({"key": k, "status": r["status"], "check_seconds": r.get("check_seconds"), "step_wall": m.get("wall", {}).get("median_ms"), "step_wall_iqr": m.get("wall", {}).get("iqr_ms"), "step_device": (m.get("device") or {}).get("median_ms"), "seconds": time.time() - t0}), flush=True)
