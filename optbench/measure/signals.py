"""Process signals of a run: SIGINT and SIGTERM raised as an exception where a case can record
them, and a child process that ends with its parent."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM reached this process inside :func:`interruptible` (``signal``: its
    name)."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal = signal_name


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(signum: int = signal.SIGTERM, parent: int | None = None) -> bool:
    """Have the kernel send ``signum`` to this process when its parent ends, however it ends
    (SIGKILL too): ``prctl(PR_SET_PDEATHSIG)``, Linux only; kept across ``exec``. The parent is the
    thread that started this process: call it in a process started from its parent's main thread.
    Where the parent has ended already (it is no longer ``parent``, default the parent when this is
    called), ``signum`` is sent now. Returns whether it is set (False off Linux or where prctl
    fails)."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid() if parent is None else parent
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent ended before prctl took effect
        os.kill(os.getpid(), signum)
    return True


@contextmanager
def interruptible() -> Iterator[None]:
    """Inside, SIGINT and SIGTERM raise :class:`Interrupted` in the main thread (SIGTERM would
    otherwise end the process on the spot, with no word on the case it was measuring). Only the
    first does: later ones are ignored while that interrupt is handled, so that what it stopped gets
    recorded; the previous handlers are back once the code leaves. A no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal raised
        if not raised:
            raised = True
            raise Interrupted(signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
