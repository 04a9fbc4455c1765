"""What asv measured of the benchmarks it times itself (the CPU suite's classes, which report no
progress events: :mod:`optbench.run.progress`), read back from asv's results once its run has
ended, one outcome per parameter combination, for the line per case of ``optbench run``."""

from __future__ import annotations

import ast
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from optbench.run.progress import milliseconds
from optbench.store.store import record_key


@dataclass(frozen=True)
class Outcome:
    """One combination of an asv-timed benchmark in one run: ``key`` (asv's benchmark name, the
    method included, with its parameters as a record key), ``status`` ('ok', or 'failed' where asv
    stored no value) and asv's figure, seconds per call (None where it has none)."""

    key: str
    status: str
    seconds: float | None

    def line(self) -> str:
        """The line of this combination, as a grid case's (``progress.case_line``) without its
        progress."""
        if self.seconds is None:
            return f"optbench: {self.key}: {self.status} (asv's log says why)"
        return (
            f"optbench: {self.key}: {self.status}, {milliseconds(self.seconds * 1e3)} ms "
            "(asv's timer)"
        )


def outcomes(
    asv_results: Path,
    machine: str,
    commit: str,
    benchmarks: Mapping[str, Sequence[str]],
    since: float,
    select: str | None = None,
) -> list[Outcome]:
    """The combinations of ``benchmarks`` (catalog name, as 'bench_cpu.MLP' -> its parameter names)
    that asv's results under ``asv_results`` hold for ``commit`` on ``machine``, of the methods asv
    started at Unix time ``since`` or later (this run's: an earlier run's values stay in the file),
    in asv's order; with ``select``, only those whose case key (``bench_cpu.MLP|impl=eager``) it
    matches (asv ran no other: ``optbench.suite.catalog.asv_pattern``)."""
    from asv.results import iter_results_for_machine_and_hash

    found: list[Outcome] = []
    for results in iter_results_for_machine_and_hash(str(asv_results), machine, commit):
        for key in results.get_all_result_keys():
            name = key.rsplit(".", 1)[0]
            started = results.started_at.get(key)
            if name not in benchmarks or started is None or started < since * 1000:
                continue
            grid = results.get_result_params(key)
            values = results.get_result_value(key, grid)
            for combo, value in zip(_combinations(grid), values):
                params = dict(zip(benchmarks[name], combo))
                if select and not re.search(select, record_key(name, params)):
                    continue
                timed = value is not None and not math.isnan(value)
                found.append(
                    Outcome(
                        record_key(key, params),
                        "ok" if timed else "failed",
                        float(value) if timed else None,
                    )
                )
    return found


def _combinations(grid: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """asv's parameter combinations in its order (the product of its params, each a value's repr:
    a string's value is read back)."""
    return [
        tuple(str(ast.literal_eval(v)) if v[:1] in ("'", '"') else v for v in combo)
        for combo in itertools.product(*grid)
    ]
