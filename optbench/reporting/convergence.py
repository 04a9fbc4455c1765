"""The convergence check's verdicts (``optbench run --suite convergence``), for the headline and the
index: per machine, each variant of the catalog's convergence grid with its newest verdict (its
newest ok or wrong record; else its newest record, whose status then shows: a timeout or a skip
decided nothing), the figures it was decided by (its loss curve's RMS deviation from the eager
seeds' mean, and the tolerance, both in nats), the eager seeds it was judged against (how many, and
the run that trained them where another run did), its run, commit and GPU, and how many of the
variant's stored verdicts on the machine were ok: a verdict that flipped between runs shows there.
"""

from __future__ import annotations

from dataclasses import dataclass

from optbench.reporting.data import Run, run_cells, run_gpu
from optbench.store.records import Record
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


def convergence_rows(history: list[Run]) -> list[ConvergenceRow]:
    """Each variant of ``catalog.CONVERGENCE`` that one machine's ``history`` has a record of, in
    the catalog's order, with its newest record that reached a verdict (ok or wrong; else its
    newest), by run id."""
    found: dict[str, list[tuple[str, str, Record, str]]] = {}
    for commit in history:
        for run_id, records in commit.by_run.items():
            for rec in records.values():
                entry = catalog.BENCHMARKS.get(rec.benchmark)
                if entry and entry.kind == "convergence":
                    found.setdefault(rec.params["variant"], []).append(
                        (run_id, commit.commit, rec, run_gpu(records))
                    )
    rows = []
    for variant in catalog.CONVERGENCE:
        stored = sorted(found.get(variant, []), key=lambda s: s[0])
        if not stored:
            continue
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
        "Convergence check (optbench.suite.convergence: the 100M model trained a few hundred "
        "steps on a synthetic language): each variant's newest verdict (its newest ok or wrong "
        "record; else its newest record's status). A variant passes where its loss curve's RMS "
        "deviation from the eager seeds' mean is at most the tolerance, a multiple of the seeds' "
        "spread (nats); eager's own row is its seed 0 against all its seeds, and it is wrong only "
        "where a seed did not learn. Eager seeds: how many, and the run that trained them where it "
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
            *run_cells(r.run, r.commit, r.gpu),
            f"{r.passed} of {r.verdicts}",
        ]
        for r in rows
    ]
    return caption, header, body
