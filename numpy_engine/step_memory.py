"""Whether a run's training steps fit in memory, checked before the first step: the bytes a
step takes beyond the parameters (step_bytes), against what the machine has free
(memory.check_fits), counted together for the ranks of a data-parallel run that share a
machine. train.py checks each run so before it starts.
"""

from __future__ import annotations

from numpy_engine.loop import TrainState
from numpy_engine.memory import check_fits
from numpy_engine.models import Model
from numpy_engine.parallel import OneProcess

# What a step holds besides the values check_step_fits counts: its Python objects and small
# arrays, and the optimizer's scratch (at most 1.75 MB: optim.Optimizer.__init__)
STEP_OVERHEAD_BYTES = 4 * 2**20


def check_step_fits(
    what: str, model: Model, cfg, length: int, state: TrainState | None, parallel=None
) -> None:
    """Refuse, up front, a step that cannot fit in memory (step_bytes). The ranks of a
    data-parallel run that share a machine take their steps there at once: their bytes
    are counted together, against the least free memory any rank reads once every rank
    holds its model, so that every rank decides alike (parallel.MPIGroup)."""
    group = OneProcess() if parallel is None else parallel.group
    ranks = group.ranks_on_this_node
    tokens = f"{cfg.batch_size * length:,} tokens a step"
    if ranks > 1:
        tokens += f" on each of {ranks} ranks on this machine"
    needed = ranks * step_bytes(model, cfg, length, state, parallel)
    check_fits(f"{what} ({tokens})", needed, group.least_free_memory())


def step_bytes(model: Model, cfg, length: int, state: TrainState | None, parallel=None) -> int:
    """The bytes a run's steps take beyond the parameters, which exist already: the kind's
    generous count of a step's other values (Model.step_values), the parameters' gradients,
    the optimizer's state unless a resumed run has it already (Adam's two moments: 1 GB on
    GPT-2), and the gradient a step over ranks or micro-batches reduces into
    (parallel.DataParallel) with its scratch, as large as the largest parameter; for batches
    of cfg.batch_size rows of `length` positions, of which one forward and backward takes a
    micro-batch's rows."""
    vectors = 1  # parameter-sized: the gradients
    rows, scratch = cfg.batch_size, 0  # the rows one forward takes; the reduction's scratch
    if state is None:
        vectors += len(cfg.optimizer_class.state_names)
    if parallel is not None and not parallel.plain:
        vectors += 1
        scratch = max(p.size for p in model.params.values())
        rows = parallel.micro_batch_rows(cfg.batch_size)
    values = type(model).step_values(model.config, rows, length)
    values += vectors * model.flat.size + scratch
    return values * model.flat.itemsize + STEP_OVERHEAD_BYTES
