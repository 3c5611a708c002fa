"""Stopping a training run between two steps, on Ctrl-C (SIGINT) or `kill` (SIGTERM).

Python's defaults stop the process wherever it is: Ctrl-C with a traceback from inside a
layer, SIGTERM without a word, and either loses what the run did since its last
checkpoint. While a run trains, the first of these signals is noted (and acknowledged on
stderr at once), and the loop stops after the step in progress. Between steps the
parameters, the optimizer's moments and the batch sampler agree with one another, so the
loop can save a checkpoint there that resumes bit for bit. A second signal stops at once
(KeyboardInterrupt): the checkpoints already written are intact, since each is replaced
atomically.

Only in the main thread of a single process. Python runs signal handlers in the main
thread, and the ranks of a data-parallel run would each stop after a different step and
then wait for one another forever: there Ctrl-C ends every rank at once
(parallel.run_as_rank), and the last --checkpoint-every checkpoint resumes. A signal the
process ignores (SIG_IGN, as SIGINT in a job started with & from a script), or one whose
handler was set outside Python, is left as it is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)
ACKNOWLEDGED = "stopping after the step in progress; a second Ctrl-C stops at once, unsaved\n"


class TrainingInterrupted(KeyboardInterrupt):
    """A run stopped between steps by a signal. A KeyboardInterrupt, so that `except
    Exception` does not take it for an error; status is the shell's 128 + the signal."""

    def __init__(self, signum: int, step: int, total: int, saved_in=None) -> None:
        self.signum, self.step, self.saved_in = signum, step, saved_in
        how = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
        if saved_in is None:
            kept = "nothing saved (give --out DIR to keep a run)"
        else:
            kept = f"saved in {saved_in}: continue with `numpy-engine train --resume {saved_in}`"
        super().__init__(f"stopped by {how} after step {step} of {total}; {kept}")

    @property
    def status(self) -> int:
        return 128 + self.signum


class StopRequests:
    """A context in which SIGINT and SIGTERM are noted in .signum instead of stopping the
    process; a second one raises KeyboardInterrupt. The previous handlers come back on
    exit. Where handlers cannot be set (not the main thread) or enabled is False, nothing
    changes and .signum stays None."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled, self.signum, self._before = enabled, None, {}

    def __enter__(self) -> StopRequests:
        if self.enabled and threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                current = signal.getsignal(signum)  # None: set outside Python, left alone
                if current is not None and current is not signal.SIG_IGN:
                    self._before[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._before.items():
            signal.signal(signum, handler)
        self._before = {}

    def _note(self, signum: int, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt  # the second: at once, mid-step
        self.signum = signum
        # said now, not after the step and the save (seconds on GPT-2), lest a second
        # Ctrl-C cut them short; os.write, not print: the main thread may be in a print
        with contextlib.suppress(OSError):
            os.write(2, ACKNOWLEDGED.encode())
