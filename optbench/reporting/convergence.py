"""The convergence check's verdicts (``optbench run --suite convergence``), for the headline and the
index: per machine, each variant's newest verdict, with the figures it was decided by (its loss
curve's RMS deviation from the eager seeds' mean, and the tolerance, both in nats), the eager seeds
it was judged against (how many, and the run that trained them where another run did), its run,
commit and GPU, and how many of the variant's stored verdicts on the machine were ok: a verdict
that flipped between runs shows there.
"""

from __future__ import annotations

from dataclasses import dataclass

from optbench.reporting.data import Run
from optbench.store.records import Record
from optbench.store.store import MACHINE_KEY
from optbench.suite import catalog

VERDICTS = ("ok", "wrong")  # the statuses that are verdicts (a timeout or a skip decided nothing)


@dataclass(frozen=True)
class ConvergenceRow:
    """A variant's newest convergence record on one machine, and its stored verdicts' count."""

    variant: str
    record: Record
    run: str
    commit: str
    gpu: str  # the first 8 hex digits of its GPU's UUID; '' where the run did not record it
    verdicts: int  # stored ok or wrong records of the variant on the machine
    passed: int  # of which ok


def _gpu(records: dict[str, Record]) -> str:
    machine = records.get(MACHINE_KEY)
    return str(machine.info.get("gpu_uuid") or "")[4:12] if machine else ""


def convergence_rows(history: list[Run]) -> list[ConvergenceRow]:
    """Each convergence variant of one machine's ``history`` with its newest record that reached
    a verdict (ok or wrong; else its newest), in the catalog's order."""
    found: dict[str, list[tuple[str, str, Record, str]]] = {}
    for commit in history:
        for run_id, records in commit.by_run.items():
            for rec in records.values():
                if catalog.BENCHMARKS.get(rec.benchmark) and rec.benchmark.startswith(
                    "bench_convergence."
                ):
                    found.setdefault(rec.params["variant"], []).append(
                        (run_id, commit.commit, rec, _gpu(records))
                    )
    order = {v: i for i, v in enumerate(catalog.CONVERGENCE)}
    rows = []
    for variant, stored in sorted(found.items(), key=lambda kv: order.get(kv[0], len(order))):
        stored.sort(key=lambda s: s[0])
        decided = [s for s in stored if s[2].status in VERDICTS]
        run, commit, rec, gpu = (decided or stored)[-1]
        passed = sum(s[2].status == "ok" for s in decided)
        rows.append(ConvergenceRow(variant, rec, run, commit, gpu, len(decided), passed))
    return rows


def _seeds(rec: Record) -> str:
    eager = rec.info.get("eager") or {}
    n = len(eager.get("curves") or ())
    source = eager.get("from_run")
    return f"{n} (run {source[-6:]})" if source else str(n) if n else "–"


def _nats(rec: Record, field: str) -> str:
    value = rec.info.get(field)
    return f"{value:.4f}" if isinstance(value, float) else "–"


def convergence_table(rows: list[ConvergenceRow]) -> tuple[str, list[str], list[list[str]]]:
    """(caption, header, rows) of the table (module docstring)."""
    caption = (
        "Convergence check (100M, 300 steps of training on a synthetic language; "
        "optbench.suite.convergence): each variant's newest verdict. A variant passes where its "
        "loss curve's RMS deviation from the eager seeds' mean is at most the tolerance, 4 times "
        "the seeds' spread (nats); eager seeds: how many, and the run that trained them where it "
        "was another; stored verdicts: how many of the variant's ok or wrong records on this "
        "machine were ok."
    )
    header = [
        "variant",
        "verdict",
        "RMS deviation",
        "tolerance",
        "eager seeds",
        "final loss",
        "run",
        "commit",
        "GPU",
        "stored verdicts ok",
    ]
    body = [
        [
            r.variant,
            r.record.status,
            _nats(r.record, "rms_deviation"),
            _nats(r.record, "tolerance"),
            _seeds(r.record),
            _nats(r.record, "final_loss"),
            r.run[-6:],
            r.commit[:8],
            r.gpu or "n/a",
            f"{r.passed} of {r.verdicts}",
        ]
        for r in rows
    ]
    return caption, header, body
