"""The faster of two ways to compute the same thing, chosen by timing real calls.

Some choices of speed depend on the machine and no feature of it tells them apart: one row
against GPT-2's (50257, 768) head, from memory, on one thread, took OpenBLAS's
matrix-vector product 10.4 ms on the AMD EPYC Zen 4 and row dots (np.vecdot) 5.6-6.0, while
on the Intel Xeon the product took 9.6 ms and the row dots 10.8, and on two threads there
5.0 and 10.9, since the row dots run on one core (docs/performance.md, section 5). So such
a choice is measured where it runs: on the first calls of the work itself, which meet the
data where the work leaves it (in cache or in memory), as a separate timing would not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# Calls of each path timed before the choice: GPT-2's decoding makes 49 such calls a token
# (four weights a block, and the head), an odd number, so the turns swap between tokens and
# each path meets each weight in the first two. Where measured, the slower of the two took
# 1.13x to 2.3x the faster's time (docs/performance.md, section 5).
TRIALS = 64


class FasterOfTwo:
    """Calls `first` and `second` in turn, timing each per unit of work, until each has
    made `trials` calls; from then on calls only the one that took less time per unit.

    Both must return the same values up to rounding: the calls made while timing mix them.
    `clock` is time.perf_counter; a test gives its own."""

    def __init__(
        self,
        first: Callable,
        second: Callable,
        trials: int = TRIALS,
        clock: Callable = time.perf_counter,
    ) -> None:
        self.paths = (first, second)
        self.trials = trials
        self.clock = clock
        self.seconds = [0.0, 0.0]  # each path's time over its timed calls
        self.work = [0, 0]  # and the units of work they did
        self.calls = [0, 0]
        self.chosen: Callable | None = None

    def __call__(self, *args, work: int) -> Any:
        """The result of the chosen path, or while choosing of the path whose turn it is;
        `work` counts this call's units (rows x a weight's entries), at least 1, to compare
        calls of any size."""
        if self.chosen is not None:
            return self.chosen(*args)
        turn = 0 if self.calls[0] <= self.calls[1] else 1
        start = self.clock()
        out = self.paths[turn](*args)
        self.seconds[turn] += self.clock() - start
        self.work[turn] += work
        self.calls[turn] += 1
        if self.calls[1] == self.trials:
            self.chosen = self.paths[self.faster()]
        return out

    def faster(self) -> int:
        """0 or 1: the path that took less time per unit of work so far (0 on a tie)."""
        per_unit = [s / w for s, w in zip(self.seconds, self.work, strict=True)]
        return int(per_unit[1] < per_unit[0])
