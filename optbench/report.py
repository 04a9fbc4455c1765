"""``optbench report``: asv's HTML plus optbench's own pages and charts, and the README's headline table.

Pages under ``html/optbench/``: per machine, the speedup of each training-step variant over the eager
step (wall clock, ms per optimizer step), peak memory per variant, tokens/s and MFU per size, each
kernel's device time over its roofline floor, the history of the headline numbers over commits, and a
side-by-side comparison of two commits. Every chart says which clock and unit it shows. Emulated machines
(``<gpu>-emulating-<target>``) get their own pages, never mixed with real ones.

A machine's figures are the newest record of each benchmark case across its commits (suites are often run
in parts); every table names the commits its figures come from.
"""

from __future__ import annotations

import argparse
import html
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from optbench.store import MACHINE_KEY, ResultStore

ROOT = Path(__file__).resolve().parent.parent
SIZES = ("tiny", "100M", "500M", "1B")
HEADLINE_KERNELS = {"rmsnorm": "RMSNorm", "swiglu": "SwiGLU", "qknorm": "QKNorm", "linear_ce": "LinearCrossEntropy"}


def latest_records(store: ResultStore, machine: str) -> dict[str, dict]:
    """The newest ok-or-not record of every benchmark case on ``machine`` (by record date, then file order)."""
    newest: dict[str, dict] = {}
    for commit in store.commits(machine):
        for key, rec in store.load(machine, commit).items():
            if key.startswith("__") or rec.get("reason", "").startswith("not selected"):
                continue
            if key not in newest or rec.get("date", "") >= newest[key].get("date", ""):
                newest[key] = rec
    return newest


def median(rec: dict, metric: str, clock: str) -> float | None:
    t = (rec.get("metrics", {}).get(metric) or {}).get(clock)
    return t["median_ms"] if rec.get("status") == "ok" and t else None


def peak_total_gib(rec: dict, metric: str) -> float | None:
    """Peak device memory during ``metric``: resident bytes before it plus the peak above them, GiB."""
    extra, base = rec.get("peak_mem_bytes", {}).get(metric), rec.get("mem_base_bytes", {}).get(metric)
    return None if extra is None else (extra + (base or 0)) / 2**30


def bf16_peak_tflops(store: ResultStore, machine: str) -> float | None:
    """The hardware profile's dense bf16 peak of the machine (or of the emulated target)."""
    from optbench.hardware import lookup

    info = {}
    for commit in store.commits(machine):
        info = store.load(machine, commit).get(MACHINE_KEY, {}).get("info", info)
    key = info.get("emulate") or info.get("profile")
    try:
        return lookup(key).peak_tflops.get("bf16") if key else None
    except KeyError:
        return None


def step_rows(store: ResultStore, machine: str) -> list[dict[str, Any]]:
    """One row per (size, variant) of bench_step: ms/step (wall), speedup vs eager, tokens/s, MFU, peak GiB."""
    recs = latest_records(store, machine)
    peak = bf16_peak_tflops(store, machine)
    rows = []
    for rec in recs.values():
        if not rec["benchmark"].startswith("bench_step.Step"):
            continue
        size = rec["benchmark"].removeprefix("bench_step.Step")
        ms = median(rec, "step", "wall")
        eager = recs.get(f"bench_step.Step{size}|variant=eager")
        base = median(eager, "step", "wall") if eager else None
        tokens, flops = rec.get("info", {}).get("tokens"), rec.get("flops", {}).get("step")
        rows.append({
            "size": size, "variant": rec["params"]["variant"], "status": rec["status"], "ms": ms,
            "speedup": base / ms if ms and base else None,
            "tok_s": tokens / ms * 1e3 if ms and tokens else None,
            "mfu": flops / (ms / 1e3) / (peak * 1e12) if ms and flops and peak else None,
            "peak_gib": peak_total_gib(rec, "step"), "commit": rec["commit"][:8],
            "check_s": rec.get("check_seconds"), "reason": rec.get("reason", ""),
        })
    return sorted(rows, key=lambda r: (SIZES.index(r["size"]) if r["size"] in SIZES else 9, r["variant"]))


def kernel_rows(store: ResultStore, machine: str) -> list[dict[str, Any]]:
    """One row per kernel case: device ms fwd and fwd+bwd, speedup vs eager, floor and floor ratio."""
    from optbench.hardware import lookup
    from optbench.roofline import Ceilings, floor_ms

    recs = latest_records(store, machine)
    prof_key = next((store.load(machine, c).get(MACHINE_KEY, {}).get("info", {}).get("profile")
                     for c in reversed(store.commits(machine))), None)
    try:
        ceilings = Ceilings.from_profile(lookup(prof_key)) if prof_key else None
    except KeyError:
        ceilings = None
    rows = []
    for rec in recs.values():
        if not rec["benchmark"].startswith("bench_kernels."):
            continue
        metric = "fwdbwd" if "fwdbwd" in rec.get("metrics", {}) else "fwd"
        ms = median(rec, metric, "device")
        eager_key = rec["key"].rsplit("|impl=", 1)[0] + "|impl=" + ("loop" if "GradStats" in rec["key"] else "eager")
        base = median(recs[eager_key], metric, "device") if eager_key in recs else None
        dtype = "fp32" if "GradStats" in rec["key"] else "bf16"
        floor = (floor_ms(rec["flops"][metric], rec["bytes"][metric], ceilings, dtype)
                 if ceilings and rec.get("flops") else None)
        rows.append({"op": rec["benchmark"].removeprefix("bench_kernels."), "shape": rec["params"]["shape"],
                     "impl": rec["params"]["impl"], "status": rec["status"], "metric": metric,
                     "fwd_ms": median(rec, "fwd", "device"), "ms": ms, "speedup": base / ms if ms and base else None,
                     "floor_ms": floor, "floor_ratio": ms / floor if ms and floor else None,
                     "peak_mib": (rec.get("peak_mem_bytes", {}).get(metric) or 0) / 2**20,
                     "commit": rec["commit"][:8]})
    return sorted(rows, key=lambda r: (r["op"], r["shape"], r["impl"]))


def _fmt(v: Any, spec: str = ".3g") -> str:
    return "" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def headline_table(store: ResultStore, machine: str | None = None) -> str:
    """Markdown: step speedup vs eager per variant and size (wall), kernel speedups vs eager (device)."""
    machines = [machine] if machine else [m for m in store.machines() if not m.startswith("cpu")
                                          and "-emulating-" not in m]
    out = []
    for m in machines:
        steps = [r for r in step_rows(store, m) if r["ms"]]
        commits = sorted({r["commit"] for r in steps} | {r["commit"] for r in kernel_rows(store, m) if r["ms"]})
        out.append(f"**{m}** (commits {', '.join(commits)}; `optbench report --readme`)\n")
        out.append("| size | variant | ms/step (wall) | speedup vs eager | tokens/s | MFU (bf16 peak) | peak GiB |")
        out.append("|---|---|---|---|---|---|---|")
        for r in steps:
            out.append(f"| {r['size']} | {r['variant']} | {r['ms']:.1f} | {_fmt(r['speedup'], '.2f')}x | "
                       f"{_fmt(r['tok_s'], ',.0f')} | {_fmt(r['mfu'], '.1%')} | {_fmt(r['peak_gib'], '.1f')} |")
        out.append("\n| kernel | shape | impl | fwd ms (device) | fwd+bwd ms (device) | vs eager | x floor |")
        out.append("|---|---|---|---|---|---|---|")
        for r in kernel_rows(store, m):
            if r["ms"]:
                out.append(f"| {r['op']} | {r['shape']} | {r['impl']} | {_fmt(r['fwd_ms'], '.4f')} | "
                           f"{r['ms']:.4f} | {_fmt(r['speedup'], '.2f')}x | {_fmt(r['floor_ratio'], '.2f')} |")
    return "\n".join(out)


def update_readme(store: ResultStore, path: Path = ROOT / "README.md") -> None:
    """Replaces the README text between the headline markers with :func:`headline_table`."""
    from optbench.store import write_text_atomic

    start, end = "<!-- headline:start -->", "<!-- headline:end -->"
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    write_text_atomic(path, f"{head}{start}\n{headline_table(store)}\n{end}{tail}")


def _bar_chart(path: Path, labels: list[str], values: list[float], title: str, xlabel: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.28 * len(labels) + 1.2))
    ax.barh(labels, values, color="#4c72b0")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.invert_yaxis()
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _table(rows: list[dict], cols: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:1em}} td,th{{border:1px solid #ccc;padding:2px 6px;font-size:12px}}
table{{border-collapse:collapse}}</style></head>
<body onload="document.body.dataset.imagesOk=[...document.images].every(i=>i.naturalWidth>0)?'1':'0'">
<h1>{title}</h1>{body}</body></html>"""


def machine_pages(store: ResultStore, machine: str, out: Path) -> list[str]:
    """Writes the chart pages of one machine; returns their file names."""
    pages = []
    steps = [r for r in step_rows(store, machine) if r["ms"]]
    for size in SIZES:
        rows = [r for r in steps if r["size"] == size]
        if not rows:
            continue
        stem = f"{machine}-step-{size}"
        _bar_chart(out / f"{stem}-speedup.png", [r["variant"] for r in rows], [r["speedup"] or 0 for r in rows],
                   f"{machine} {size}: speedup of each variant over the eager step (wall clock per step)", "x eager")
        _bar_chart(out / f"{stem}-memory.png", [r["variant"] for r in rows], [r["peak_gib"] or 0 for r in rows],
                   f"{machine} {size}: peak device memory per step", "GiB")
        body = (f'<img src="{stem}-speedup.png"><img src="{stem}-memory.png">'
                + _table(rows, ["variant", "ms", "speedup", "tok_s", "mfu", "peak_gib", "check_s", "commit"]))
        (out / f"{stem}.html").write_text(PAGE.format(title=f"{machine}: training step at {size}", body=body))
        pages.append(f"{stem}.html")
    kernels = [r for r in kernel_rows(store, machine) if r["ms"]]
    if kernels:
        stem = f"{machine}-kernels"
        labels = [f"{r['op']} {r['shape']} {r['impl']}" for r in kernels]
        _bar_chart(out / f"{stem}-floor.png", labels, [r["floor_ratio"] or 0 for r in kernels],
                   f"{machine}: kernel fwd+bwd device time over its roofline floor (datasheet peaks)", "x floor")
        _bar_chart(out / f"{stem}-speedup.png", labels, [r["speedup"] or 0 for r in kernels],
                   f"{machine}: kernel speedup over eager (device time, fwd+bwd)", "x eager")
        body = (f'<img src="{stem}-speedup.png"><img src="{stem}-floor.png">'
                + _table(kernels, ["op", "shape", "impl", "fwd_ms", "ms", "speedup", "floor_ms", "floor_ratio",
                                   "peak_mib", "commit"]))
        (out / f"{stem}.html").write_text(PAGE.format(title=f"{machine}: kernels (device time, ms)", body=body))
        pages.append(f"{stem}.html")
    return pages


def compare_page(store: ResultStore, machine: str, base: str, head: str, out: Path) -> str:
    """A side-by-side page of two commits on one machine (optbench compare's table)."""
    from optbench.compare import compare

    changes = compare(store, base, head, machines=[machine])
    rows = [{"key": c.key, "metric": c.metric, "quantity": c.quantity, "clock": c.clock,
             "base": c.base.median if c.base else None, "head": c.head.median if c.head else None,
             "ratio": c.ratio, "significant": c.significant, "regression": c.regression} for c in changes]
    name = f"{machine}-compare-{base[:8]}-{head[:8]}.html"
    body = _table(rows, ["key", "metric", "quantity", "clock", "base", "head", "ratio", "significant", "regression"])
    (out / name).write_text(PAGE.format(title=f"{machine}: {base[:8]} vs {head[:8]}", body=body))
    return name


def publish(results: Path | None = None, html_dir: Path | None = None, compare_pair: tuple[str, str] | None = None,
            run_asv: bool = True) -> Path:
    """asv publish (when asv results exist), then optbench's pages; returns html/optbench/index.html."""
    store = ResultStore(results)
    html_dir = Path(html_dir or ROOT / "html")
    if run_asv and any(store.root.glob("*/*-*.json")):
        subprocess.run([sys.executable, "-m", "optbench.asv_atomic", "publish"], cwd=ROOT, check=False)
    out = html_dir / "optbench"
    out.mkdir(parents=True, exist_ok=True)
    links: dict[str, list[str]] = defaultdict(list)
    for machine in store.machines():
        links[machine] = machine_pages(store, machine, out)
        commits = store.commits(machine)
        pair = compare_pair or (tuple(commits[-2:]) if len(commits) >= 2 else None)
        if pair:
            try:
                links[machine].append(compare_page(store, machine, *pair, out))
            except (KeyError, SystemExit):
                pass
    items = "".join(f"<h2>{html.escape(m)}</h2><ul>" + "".join(f'<li><a href="{p}">{p}</a></li>' for p in ps)
                    + "</ul>" for m, ps in links.items())
    index = out / "index.html"
    index.write_text(PAGE.format(title="optbench results", body='<p><a href="../index.html">asv</a></p>' + items))
    print(f"report: {index}")
    return index


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="optbench report", description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path)
    p.add_argument("--html", type=Path)
    p.add_argument("--compare", nargs=2, metavar=("BASE", "HEAD"))
    p.add_argument("--readme", action="store_true", help="rewrite the README's headline table")
    p.add_argument("--print", action="store_true", help="print the headline table")
    args = p.parse_args(argv)
    if args.readme or args.print:
        store = ResultStore(args.results)
        if args.readme:
            update_readme(store)
        if args.print:
            print(headline_table(store))
        return 0
    publish(args.results, args.html, tuple(args.compare) if args.compare else None)
    return 0
