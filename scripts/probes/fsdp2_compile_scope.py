"""torch.compile under FSDP2 on the CPU: one launch of 2 gloo ranks, the tiny model, fsdp2 around
the compile-default step (fp32, B=4, S=64); prints the launch's exit status, its status, the compile
scope it ran with, rank 0's phases (torch.compile's seconds in the check among them) and the worst
gradient error. Run it from a checkout, or from a worktree of another commit with PYTHONPATH
naming that worktree, each with TORCHINDUCTOR_CACHE_DIR set (a fresh one: cold; reused: warm)::

    TRITON_INTERPRET=1 PYTHONPATH=$PWD python scripts/probes/fsdp2_compile_scope.py
"""

from __future__ import annotations

from optbench.suite import distributed


def main() -> None:
    print("code:", distributed.__file__)
    code, result, tail = distributed.launch(
        2,
        *("--size", "tiny", "--variant", "fsdp2", "--device", "cpu", "--precision", "fp32"),
        *("--step-variant", "compile-default", "--batch-size", "4", "--seq-len", "64"),
        timeout_s=600,
    )
    if result is None:
        print(code, tail[-3000:])
        return
    options, check = result.get("options") or {}, result.get("check") or {}
    print(
        code,
        result.get("status"),
        options.get("compile_scope"),
        result.get("phases"),
        check.get("grad_error"),
    )
    if code:
        print(tail[-3000:])


if __name__ == "__main__":
    main()
