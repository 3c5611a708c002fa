"""How many NumPy calls one training step makes: the engine's per-call cost on small models.

A small model's step is bound by calls, not arithmetic: each NumPy call costs about a
microsecond of dispatch whatever its size. To count them, one step runs on an ndarray
subclass, `Counted`, that sees every call the engine's code makes on an array:

- every ufunc: arithmetic and in-place operators, np.exp, matmul (`@`), reductions
  (`.sum()`, `.max()`), each `ufunc.method` once;
- every NumPy function that dispatches on its arguments (np.where, np.concatenate, ...);
- every index read or write (`a[rows, top]`, `a[...] = b`).

Only the outermost call counts: a NumPy function that calls ufuncs inside is one call, as
it is one dispatch from the engine's code. (Array methods that NumPy writes in Python, such
as `.mean()`, are not seen themselves: they count as the ufunc calls they make.) Not
counted: attribute reads (`.shape`, `.T`), `.reshape` and other methods that make views,
and the calls that make arrays (np.empty, np.asarray, np.arange: CONSTRUCTORS).

Every array the step reads or makes is a Counted one: the model's parameters and the batch
are given as Counted copies, the optimizer's moments and scratch become Counted views for
the step, and the engine's modules see a NumPy whose CONSTRUCTORS make Counted arrays. Not
so: what a functools cache keeps (a vector of ones, a causal mask), made without a call
once warm, and a random generator's draws (dropout's masks; the bench's workloads drop
nothing). Before the fifty-third session only the parameters and the batch were Counted,
and the calls made on an array the step makes (an np.empty a product writes by out=, the
checked ids) or on the moments alone went unseen: 453 of copy's 542 calls were counted,
724 of char-lm's 826, 7825 of large's 9880.

The step is not timed: the subclass is slow. Its products are, each by itself
(Counted.product_seconds): a product's arrays are where the step left them, in cache or
not, and the subclass's own work falls outside each product's time. Its broadcasts are
recorded (Counted.broadcasts), for where_time_goes to time: NumPy runs a binary call that
spreads one operand over another's rows one short row at a time.
"""

from __future__ import annotations

import collections
import sys
import types
from time import perf_counter

import numpy as np

from numpy_engine.params import unflatten
from numpy_engine.threads import set_threads, threads

PRODUCT_CALLS = ("matmul.__call__", "dot")  # the calls Counted.products records


class Counted(np.ndarray):
    """An ndarray that counts the NumPy calls made on it (class-wide tallies)."""

    calls: collections.Counter = collections.Counter()
    products: list = []  # (left shape, right shape, dtype) of each outermost matmul or np.dot
    product_seconds: list = []  # the time each of those took where the step made it
    # (ufunc, ((shape, dtype) of each operand)) of each outermost binary ufunc call that
    # spreads an array of more than one number over a larger shape (a bias over rows, a
    # row's mean over its entries)
    broadcasts: list = []
    tape: list | None = None  # while recorded_step runs: each outermost call, as `run` below
    _depth = 0  # > 0 inside a counted call: the calls it makes itself are not counted

    @classmethod
    def _count(cls, name: str, run):
        """Count the call `name` and make it: run() makes it on plain arrays."""
        timed = cls._depth == 0 and name in PRODUCT_CALLS
        if cls._depth == 0:
            cls.calls[name] += 1
            if cls.tape is not None:
                cls.tape.append(run)
        cls._depth += 1
        start = perf_counter() if timed else 0.0
        try:
            return run()
        finally:
            if timed:
                cls.product_seconds.append(perf_counter() - start)
            cls._depth -= 1

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        inputs = tuple(_plain(x) for x in inputs)
        if ufunc is np.matmul and method == "__call__":
            Counted._note_product(*inputs)
        elif ufunc.nin == 2 and ufunc.signature is None and method == "__call__":
            Counted._note_broadcast(ufunc, inputs)  # elementwise: not vecdot's core axes
        if out is not None:
            kwargs["out"] = tuple(_plain(x) for x in out)
        result = Counted._count(
            f"{ufunc.__name__}.{method}", lambda: getattr(ufunc, method)(*inputs, **kwargs)
        )
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _counted(result)

    def __array_function__(self, func, types, args, kwargs):
        args = tuple(_plain_nested(x) for x in args)
        kwargs = {key: _plain_nested(value) for key, value in kwargs.items()}
        if func is np.dot:
            Counted._note_product(*args[:2])
        return _counted(Counted._count(func.__name__, lambda: func(*args, **kwargs)))

    @classmethod
    def _note_product(cls, left, right) -> None:
        if cls._depth == 0:
            left, right = np.asarray(left), np.asarray(right)
            cls.products.append((left.shape, right.shape, np.result_type(left, right)))

    @classmethod
    def _note_broadcast(cls, ufunc, inputs) -> None:
        if cls._depth == 0:
            arrays = [np.asarray(x) for x in inputs]
            whole = np.broadcast_shapes(*(a.shape for a in arrays))
            if any(a.size > 1 and a.shape != whole for a in arrays):
                cls.broadcasts.append((ufunc, tuple((a.shape, a.dtype) for a in arrays)))

    def __getitem__(self, index):
        index = _plain_nested(index)
        return _counted(Counted._count("index", lambda: self.view(np.ndarray)[index]))

    def __setitem__(self, index, value):
        index, value = _plain_nested(index), _plain(value)

        def write():
            self.view(np.ndarray)[index] = value

        Counted._count("index write", write)


def _plain(x):
    return x.view(np.ndarray) if isinstance(x, Counted) else x


def _plain_nested(x):
    if isinstance(x, tuple | list):
        return type(x)(_plain_nested(item) for item in x)
    return _plain(x)


def _counted(result):
    if isinstance(result, tuple):
        return tuple(_counted(item) for item in result)
    if type(result) is np.ndarray:
        return result.view(Counted)
    return result


def calls_per_step(model, optimizer, batch, step) -> tuple[collections.Counter, list]:
    """The NumPy calls of step(model, optimizer, batch), by name, and its matrix products
    (Counted.products; Counted.product_seconds holds their times), on a Counted copy of the
    model's parameter vector and of the batch (the model's own vector is put back after),
    Counted views of the optimizer's arrays, and Counted arrays wherever the engine makes one
    (COUNTING_NUMPY). The engine's elementwise blocks run on one thread meanwhile: Counted's
    tallies are the class's, and helper threads making calls at the same time would
    miscount them (the same calls, on one thread)."""
    flat, params, engine_threads = model.flat, model.params, threads()
    model.flat = flat.copy().view(Counted)
    model.params = unflatten(model.flat, params)
    _set_arrays_of(optimizer, Counted)
    engine = _engine_modules()
    COUNTING_NUMPY.plain_within = _cached_code(engine)
    Counted.calls.clear()
    Counted.products.clear()
    Counted.product_seconds.clear()
    Counted.broadcasts.clear()
    if Counted.tape is not None:  # recorded_step's: from here on, as the counts
        Counted.tape.clear()
    set_threads(1)
    try:
        for module in engine:
            module.np = COUNTING_NUMPY
        step(model, optimizer, tuple(np.asarray(x).view(Counted) for x in batch))
    finally:
        for module in engine:
            module.np = np
        model.flat, model.params = flat, params
        _set_arrays_of(optimizer, np.ndarray)
        set_threads(engine_threads)
    return collections.Counter(Counted.calls), list(Counted.products)


# The NumPy functions that make arrays. During a counted step the engine's modules see
# COUNTING_NUMPY, whose versions of these return Counted arrays: otherwise an array the step
# makes (np.empty written by a product's out=, np.asarray of the checked ids) is a plain
# one, and the calls made on it alone go unseen (72 of copy's 542).
CONSTRUCTORS = frozenset(
    """array asarray ascontiguousarray asanyarray empty zeros ones full empty_like zeros_like
    ones_like full_like arange linspace eye frombuffer fromiter""".split()
)


class _CountingNumPy(types.ModuleType):
    """numpy, but for CONSTRUCTORS, whose arrays are Counted: all but those made inside the
    engine's functools-cached functions (plain_within, their code), which a cache keeps for
    the steps after, and which a warm cache makes without a call."""

    plain_within: frozenset = frozenset()

    def __getattr__(self, name: str):
        attr = getattr(np, name)
        return _making_counted(attr, self.plain_within) if name in CONSTRUCTORS else attr


def _making_counted(constructor, plain_within: frozenset):
    def counted(*args, **kwargs):
        made = constructor(*args, **kwargs)
        if type(made) is not np.ndarray or _called_within(plain_within):
            return made
        return made.view(Counted)

    return counted


def _called_within(codes: frozenset) -> bool:
    frame = sys._getframe(2)  # the caller of the constructor
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


COUNTING_NUMPY = _CountingNumPy("numpy, counting")


def _engine_modules() -> list:
    """The engine's modules that use NumPy as np."""
    return [
        module
        for name, module in list(sys.modules.items())
        if name.split(".")[0] == "numpy_engine" and getattr(module, "np", None) is np
    ]


def _cached_code(modules: list) -> frozenset:
    """The code of the modules' functools-cached functions."""
    return frozenset(
        value.__wrapped__.__code__
        for module in modules
        for value in vars(module).values()
        if callable(getattr(value, "cache_clear", None)) and hasattr(value, "__wrapped__")
    )


def _set_arrays_of(optimizer, kind: type) -> None:
    """Make the optimizer's own arrays (its moments, its scratch, the views of them it keeps
    in dicts and lists) views of kind, of the same memory: Counted for the counted step,
    whose update makes calls on them alone (17 of copy's), plain after it (arrays it made
    during the step too)."""
    if optimizer is None:  # a step that updates nothing (a forward alone)
        return
    for key, value in list(vars(optimizer).items()):
        if _holds_arrays(value):
            setattr(optimizer, key, _views(value, kind))


def _holds_arrays(value) -> bool:
    """value is an array, or a dict, list or tuple with one somewhere inside."""
    if isinstance(value, np.ndarray):
        return True
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, list | tuple) and any(_holds_arrays(item) for item in value)


def _views(value, kind: type):
    """value with each array in it, in nested dicts, lists and tuples too, a view of kind."""
    if isinstance(value, np.ndarray):
        return value.view(kind)
    if isinstance(value, dict):
        return {key: _views(item, kind) for key, item in value.items()}
    if isinstance(value, list | tuple):
        items = [_views(item, kind) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def recorded_step(model, optimizer, batch, step) -> list:
    """The outermost NumPy calls of step(model, optimizer, batch), in order, as calls_per_step
    counts them: each a function of no arguments that makes its call again, on the arrays
    the recorded step made and read (the calls' results, in-place ones included)."""
    Counted.tape = []
    try:
        calls_per_step(model, optimizer, batch, step)
        return Counted.tape
    finally:
        Counted.tape = None


def replay(tape: list) -> None:
    """Make the recorded calls again, back to back, with no Python between them but this
    loop's. An IndexError is the one that ended a Python loop over an array in the recorded
    step (iteration calls the array's __getitem__, a counted call, until it raises)."""
    for call in tape:
        try:
            call()
        except IndexError:
            pass


def bound_arrays(tape: list) -> list[np.ndarray]:
    """Every writeable array the recorded calls read or write, as a plain array, once each:
    what an in-place call can change, for a replay to put back first (snapshot, restore)."""
    found: dict[int, np.ndarray] = {}

    def collect(value) -> None:
        if isinstance(value, np.ndarray):
            plain = value.view(np.ndarray)
            if plain.flags.writeable:
                found.setdefault(id(value), plain)
        elif isinstance(value, tuple | list):
            for item in value:
                collect(item)
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)

    for call in tape:
        for cell in call.__closure__ or ():
            collect(cell.cell_contents)
    return list(found.values())


def snapshot(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [array.copy() for array in arrays]


def restore(arrays: list[np.ndarray], saved: list[np.ndarray]) -> None:
    """Put the arrays' saved values back: a replay's in-place calls (m *= b1, weights /= sums)
    would otherwise compound, replay after replay, toward overflow or subnormal numbers,
    which NumPy computes far slower."""
    for array, values in zip(arrays, saved, strict=True):
        np.copyto(array, values)
