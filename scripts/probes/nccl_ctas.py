"""Does NCCL's share of the SMs set the multi-GPU best step's cost? ddp-best-kernels (or
``--variant``) at one world size under several NCCL environments, launched one after another on the
same host.

    python3 -m scripts.probes.nccl_ctas 4 default NCCL_MAX_CTAS=8 NCCL_MAX_CTAS=4

(``--size tiny --extra='--device cpu --precision fp32'``: gloo ranks on a CPU, to try the probe.)

Each setting is one launch of ``optbench.suite.distributed`` (its check, then its timing) with
the setting's variables added to the environment; printed per setting: the check's verdict, the
slowest rank's wall median [IQR] in ms, and each rank's collective time per step with the part no
other kernel hid (torch.profiler, ``optbench.measure.overlap``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys

from optbench.suite.distributed import launch


def environment(setting: str) -> dict[str, str]:
    """'default' -> {}; 'A=1,B=2' -> {'A': '1', 'B': '2'}."""
    if setting == "default":
        return {}
    env = dict(pair.split("=", 1) for pair in setting.split(","))
    # NVLink multicast stays off on lent hosts (/work/.library/device/KINDS.md)
    kept = {"NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"}
    kept &= set(env)
    if kept:
        raise SystemExit(f"not a setting this probe changes: {', '.join(sorted(kept))}")
    return env


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("world", type=int)
    p.add_argument("settings", nargs="*", default=["default"])
    p.add_argument("--size", default="1B")
    p.add_argument("--variant", default="ddp-best-kernels")
    p.add_argument("--extra", default="", help="more arguments of optbench.suite.distributed")
    args = p.parse_args(argv)
    try:
        uuids = subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.split()
    except OSError:
        uuids = []
    print(f"GPUs: {', '.join(u[:12] for u in uuids) or 'none'}", flush=True)
    for setting in args.settings:
        code, result, tail = launch(
            args.world,
            *("--size", args.size, "--variant", args.variant, *shlex.split(args.extra)),
            env=environment(setting),
        )
        if not result or result.get("status") != "ok":
            status = f"{(result or {}).get('status')}: {(result or {}).get('reason')}"
            print(f"== {setting}: exit {code}, {status}\n{tail}", flush=True)
            continue
        step = result["step"]
        comm = [
            f"{c['communication_ms']:.1f} ({c['exposed_ms']:.2f} exposed)"
            for c in result["communication"]
            if c
        ]
        print(
            f"== {setting}: check {result['check']['grad_error']:.4f} "
            f"(timed step {result['timed_check']['grad_error']:.4f}); step wall "
            f"{step['wall']['median_ms']:.2f} ms [IQR {step['wall']['iqr_ms']:.2f}], n "
            f"{len(step['wall']['samples_ms'])}; collectives per step by rank, ms: "
            f"{', '.join(comm)}",
            flush=True,
        )
        print(json.dumps({"setting": setting, "result": result}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
