"""Timing in turns with a partner process: both sides of an A/B comparison time a host-bound case at
once, one sample each in turn, every thread of both processes on the same CPU.

A host-bound step's time is the host's: on a shared machine (a lent GPU's virtual machine) the speed
of the CPU a process runs on moves within seconds, and processes started one after the other meet
different spells (the probe ``scripts/probes/host_noise.py``; NOTES.md has its figures). Two
processes taking turns on one CPU meet the same spells, so the ratio of their paired samples keeps
the code's difference and loses most of the host's.

``optbench ab`` starts the two processes with :data:`ENV` set to ``"<read fd>,<write fd>,<first>,
<cpu>"``: a pipe from the partner and one to it, whether this side takes the first turn, and the
CPU. In each timing (:meth:`Partner.session`), after its own warm-up, each side meets the other at
a barrier that names the case, the metric and the number of samples; then both pin every thread to
the CPU, alternate :data:`SAMPLES` samples, meet again and unpin. A partner whose case fails in the
middle leaves this side to finish that session alone. Where the partner names another session,
closes its pipe (it ended) or does not answer within :data:`WAIT_S`, this process times alone from
then on. Either way the session says so (``paired`` False)."""

from __future__ import annotations

import os
import select
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

ENV = "OPTBENCH_LOCKSTEP"
SAMPLES = 30  # samples each side takes in a session (the same on both sides: they alternate)
WAIT_S = 60.0  # the longest wait for the partner (a slower warm-up) before going alone
_TURN, _MEET = b"t\n", b"m "


@dataclass
class Partner:
    """This process's end of a lockstep pair (module docstring)."""

    read_fd: int
    write_fd: int
    first: bool
    cpu: int
    paired: bool = True  # False from the moment the partner is gone or disagrees
    _buffer: bytearray = field(default_factory=bytearray, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Partner | None:
        """The partner :data:`ENV` names; None where it is unset. ValueError where it is
        malformed."""
        value = environ.get(ENV)
        if not value:
            return None
        try:
            read_fd, write_fd, first, cpu = (int(x) for x in value.split(","))
        except ValueError as exc:
            raise ValueError(f"{ENV}={value!r}: want '<read fd>,<write fd>,<0|1>,<cpu>'") from exc
        return cls(read_fd, write_fd, bool(first), cpu)

    @staticmethod
    def env_value(read_fd: int, write_fd: int, first: bool, cpu: int) -> str:
        return f"{read_fd},{write_fd},{int(first)},{cpu}"

    def _send(self, message: bytes) -> None:
        if not self.paired:
            return
        try:
            os.write(self.write_fd, message)
        except OSError:
            self.paired = False

    def _line(self) -> bytes | None:
        """The partner's next line; None (and no longer paired) at its end or after WAIT_S."""
        while b"\n" not in self._buffer:
            if not self.paired:
                return None
            ready, _, _ = select.select([self.read_fd], [], [], WAIT_S)
            chunk = os.read(self.read_fd, 4096) if ready else b""
            if not chunk:
                self.paired = False
                return None
            self._buffer += chunk
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer[:] = rest
        return line + b"\n"

    def _meet(self, label: str) -> None:
        """Wait for the partner to reach the same point (turns it left unanswered are dropped);
        another label ends the pairing."""
        want = _MEET + label.encode() + b"\n"
        self._send(want)
        while self.paired:
            line = self._line()
            if line is None or line == _TURN:
                continue
            if line != want:
                self.paired = False
            return

    @contextmanager
    def session(self, label: str) -> Iterator[Turns]:
        """Time one metric in turns with the partner. The turns begin where the samples do (after
        this side's warm-up): both meet, pin every thread to the CPU and alternate; at the end they
        meet again and unpin. ``label`` (the case and metric) must be the partner's."""
        turns = Turns(self, f"{label} {SAMPLES}")
        try:
            yield turns
        finally:
            turns.close()


@dataclass
class Turns:
    """The turns of one session: ``with turns():`` around each of :data:`SAMPLES` samples.
    ``paired`` says whether every sample so far was taken in turn with the partner; a partner that
    leaves the session (an error in its case) leaves this side to finish alone."""

    partner: Partner
    label: str
    samples: int = SAMPLES
    _taken: int = 0
    _alone: bool = False
    _pinned: dict[int, set[int]] = field(default_factory=dict)

    @property
    def paired(self) -> bool:
        return self.partner.paired and not self._alone and self._taken > 0

    def _wait(self) -> None:
        if self._alone or not self.partner.paired:
            return
        line = self.partner._line()
        if line is not None and line != _TURN:  # its closing meet: it left; keep that for close()
            self.partner._buffer[:0] = line
            self._alone = True

    @contextmanager
    def __call__(self) -> Iterator[None]:
        if self._taken == 0:
            self.partner._meet(self.label)
            if self.partner.paired:
                self._pinned = _pin_threads(self.partner.cpu)
            if not self.partner.first:
                self._wait()
        else:
            self._wait()
        self._taken += 1
        try:
            yield
        finally:
            if not self._alone:
                self.partner._send(_TURN)

    def close(self) -> None:
        """Meet the partner at the session's end (where the turns began) and unpin."""
        try:
            if self._taken > 0:
                self.partner._meet(f"{self.label} end")
        finally:
            _unpin_threads(self._pinned)
            self._pinned = {}


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _pin_threads(cpu: int) -> dict[int, set[int]]:
    """Every thread of this process on ``cpu``; returns each one's earlier CPUs (for unpinning)."""
    before: dict[int, set[int]] = {}
    for tid in _threads():
        try:
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, {cpu})
        except OSError:  # a thread that ended, or a CPU this process may not use
            continue
    return before


def _unpin_threads(before: Mapping[int, set[int]]) -> None:
    for tid, cpus in before.items():
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            continue


_PARTNER: list[Partner | None] = []


def partner() -> Partner | None:
    """This process's partner (:data:`ENV`, read once); None outside a lockstep pair."""
    if not _PARTNER:
        _PARTNER.append(Partner.from_env())
    return _PARTNER[0]
