"""Where does a host-bound step's run-to-run spread come from, and what cancels it? The eager 100M
step (as the suite builds and checks it) in fresh processes, timed in blocks; each block also times
two fixed host workloads, a CUDA launch loop (300 in-place adds on a one-element tensor, then a
sync) and a pure-Python loop, and reads the machine's CPU accounting (/proc/stat, steal included)
and the process's context switches. Processes run one at a time, alone (as the suite runs them;
some pinned to two CPUs), or as a lockstep pair of the same code: both alive, taking turns block by
block, so that a slow spell of the host falls on both.

    python3 scripts/probes/host_noise.py [ROUNDS] [placement|same] > host_noise.jsonl

``same``: every pair's two members pinned to the same one or two CPUs (another pair each round);
a third pair of each round has the gate's planted 8 ms of host sleep per step in its second
member.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

BLOCKS, STEPS_PER_BLOCK, LAUNCHES = 24, 2, 300


def _cpu_ticks() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def _python_loop() -> int:
    total = 0
    for i in range(60_000):
        total += i * i % 7
    return total


def child(turn_in: int | None, turn_out: int | None) -> None:
    import torch

    from optbench.suite.workloads import step_work

    device = os.environ.get("PROBE_DEVICE", "cuda")  # cpu and tiny: a smoke test of the probe
    work = step_work(os.environ.get("PROBE_SIZE", "100M"), "eager", device)
    work.check()
    timed = work.timed["step"]
    plant_s = float(os.environ.get("PROBE_PLANT_MS", "0")) / 1e3

    def step() -> None:
        timed()
        if plant_s:
            time.sleep(plant_s)

    tiny = torch.zeros(1, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    start = time.perf_counter()
    while time.perf_counter() - start < 2.0:  # the suite's warm-up
        step()
    sync()
    blocks = []
    for _ in range(BLOCKS):
        if turn_in is not None:
            os.read(turn_in, 1)
        ticks, usage = _cpu_ticks(), resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        for _ in range(LAUNCHES):
            tiny.add_(1.0)
        sync()
        t1 = time.perf_counter()
        _python_loop()
        t2 = time.perf_counter()
        steps, cpu_steps = [], []
        for _ in range(STEPS_PER_BLOCK):
            c0, s0 = time.process_time(), time.perf_counter()
            step()
            sync()
            steps.append((time.perf_counter() - s0) * 1e3)
            cpu_steps.append((time.process_time() - c0) * 1e3)
        after, usage2 = _cpu_ticks(), resource.getrusage(resource.RUSAGE_SELF)
        blocks.append(
            {
                "launch_ms": (t1 - t0) * 1e3,
                "python_ms": (t2 - t1) * 1e3,
                "step_ms": steps,
                "step_cpu_ms": cpu_steps,
                "ticks": [b - a for a, b in zip(ticks, after, strict=True)],
                "nivcsw": usage2.ru_nivcsw - usage.ru_nivcsw,
                "nvcsw": usage2.ru_nvcsw - usage.ru_nvcsw,
                "cpu": _current_cpu(),
            }
        )
        if turn_out is not None:
            os.write(turn_out, b"t")
    print(json.dumps({"pid": os.getpid(), "blocks": blocks}), flush=True)


def _current_cpu() -> int:
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def _spawn(
    prefix: list[str], fds: tuple[int, int] | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen:
    args = [sys.executable, __file__, "--child", *(map(str, fds) if fds else [])]
    return subprocess.Popen(
        prefix + args,
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=fds or (),
        env={**os.environ, **(env or {})},
    )


def _collect(kind: str, proc: subprocess.Popen, **extra: object) -> None:
    out, _ = proc.communicate()
    for line in out.splitlines():
        if line.startswith("{"):
            print(json.dumps({"kind": kind, **extra, **json.loads(line)}), flush=True)


def _pair(kind: str, prefix: list[str], plant: bool = False, **extra: object) -> None:
    """Two processes of the same code taking turns block by block (``plant``: the second sleeps 8
    ms more per step, as the gate's planted host-bound regression does)."""
    a_in, b_out = os.pipe()
    b_in, a_out = os.pipe()
    a = _spawn(prefix, (a_in, a_out))
    b = _spawn(prefix, (b_in, b_out), {"PROBE_PLANT_MS": "8"} if plant else {})
    os.write(b_out, b"t")  # a's first turn
    _collect(kind, a, member=0, **extra)
    _collect(kind, b, member=1, **extra)
    for fd in (a_in, b_out, b_in, a_out):
        os.close(fd)


def main(rounds: int, design: str) -> None:
    for r in range(rounds):
        if design == "placement":
            _collect("alone", _spawn([]), round=r)
            _collect("pinned", _spawn(["taskset", "-c", "2,3"]), round=r)
            _pair("pair", [], round=r)
        else:  # both members of a pair on the same CPUs, a different pair of CPUs each round
            one, two = f"{4 * r + 1}", f"{4 * r + 1},{4 * r + 2}"
            _pair("same1", ["taskset", "-c", one], round=r)
            _pair("same2", ["taskset", "-c", two], round=r)
            _pair("same2-plant", ["taskset", "-c", two], plant=True, round=r)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        fds = [int(x) for x in sys.argv[2:]]
        child(*(fds or (None, None)))
    else:
        main(
            int(sys.argv[1]) if len(sys.argv) > 1 else 3,
            sys.argv[2] if len(sys.argv) > 2 else "placement",
        )
