"""numpy_engine.faster.FasterOfTwo: the faster of two paths by timing real calls, on a
clock the test drives (each path advances it by its cost per unit of work)."""

from __future__ import annotations

import pytest

from numpy_engine.faster import FasterOfTwo


class Clock:
    """A clock that only moves when a path says it took time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def paths(clock: Clock, cost_per_unit: tuple[float, float], log: list):
    """Two paths that return the same value and cost what they are told, logging each call."""

    def path(which: int):
        def run(value: float, units: int) -> float:
            clock.now += cost_per_unit[which] * units
            log.append(which)
            return 2 * value

        return run

    return path(0), path(1)


@pytest.mark.parametrize("costs, winner", [((3.0, 1.0), 1), ((1.0, 3.0), 0), ((2.0, 2.0), 0)])
def test_alternates_while_timing_then_keeps_the_faster_per_unit(costs, winner):
    """Calls of any size alternate between the paths until each has made `trials` calls,
    then go to the one with less time per unit (the first on a tie); the results are the
    paths' own."""
    clock, log = Clock(), []
    chooser = FasterOfTwo(*paths(clock, costs, log), trials=3, clock=clock)
    sizes = [5, 1, 7, 2, 9, 4, 6, 3, 8]
    results = [chooser(float(i), units, work=units) for i, units in enumerate(sizes)]
    assert results == [2.0 * i for i in range(len(sizes))]
    assert log == [0, 1, 0, 1, 0, 1] + [winner] * 3
    assert chooser.chosen is chooser.paths[winner]
    assert chooser.calls == [3, 3] and chooser.work == [5 + 7 + 9, 1 + 2 + 4]


def test_compares_time_per_unit_not_per_call():
    """A path that met the larger calls is not the slower for it: path 1 took 12 s for 12
    units against path 0's 4 s for 2 units, so path 1 is the faster per unit."""
    clock, log = Clock(), []
    chooser = FasterOfTwo(*paths(clock, (2.0, 1.0), log), trials=2, clock=clock)
    for units in (1, 6, 1, 6, 5):
        chooser(1.0, units, work=units)
    assert chooser.seconds == [4.0, 12.0] and log[-1] == 1
