"""The test runs of a mutation run, and how a run is stopped (Ctrl-C or SIGTERM) without
leaving them, or the project's copies, behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator


class Stopped(KeyboardInterrupt):
    """A stop by a signal other than SIGINT: handled as Ctrl-C is, its number kept."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal = signum


@contextlib.contextmanager
def stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM (a `kill`, or a run started with & that ignores Ctrl-C) stops the run as
    Ctrl-C does, instead of leaving its copies and tests behind; restored after."""

    def stop(signum, frame):
        raise Stopped(signum)

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


class Running:
    """The test runs going on now, each in a session of its own, so that stop() ends each with
    all it started (Ctrl-C at a terminal reaches only this process); none starts after."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: set[int] = set()
        self._stopped = False

    def start(self, args: list[str], **kwargs) -> subprocess.Popen:
        with self._lock:
            if self._stopped:
                raise RuntimeError("the run was stopped")
            process = subprocess.Popen(args, start_new_session=True, **kwargs)
            self._sessions.add(process.pid)
        return process

    def end(self, process: subprocess.Popen) -> None:
        """Forget process once it has exited, or end its session (ended early)."""
        with self._lock:
            self._sessions.discard(process.pid)
            if process.poll() is None:
                end_session(process.pid)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for session in self._sessions:
                end_session(session)


def end_session(session: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(session, signal.SIGKILL)
