"""Data-parallel training over MPI, and gradient accumulation (the mpi extra: mpi4py, mpich).

Every rank draws the same global batch from the same sampler and takes its share of the
rows; with accumulate = K its share is cut into K micro-batches. loss_and_grads gives a
micro-batch's mean over its n counted targets, so n times it is the sum. One Allreduce per
step adds [n x gradient ..., n, n x loss, failures] over the ranks, and every rank divides
by the global count: the exact mean over the global batch whatever the padding on each
rank (docs/gradients.md#data-parallel), the same vector on every rank, the same update.
"""

from __future__ import annotations

import math
import os
import signal
import stat
import struct
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from numpy_engine import memory
from numpy_engine.checks import InputError
from numpy_engine.params import unflatten

RANK_COUNT_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")  # set by mpiexec (MPICH, Open MPI)
ABORT_GRACE_SECONDS = 1.0
UNKNOWN = 2**62  # a rank's free memory that it cannot read, in the ranks' minimum
STDERR_READ_WAIT_SECONDS = 5.0


class PeerStopped(RuntimeError):
    """Another rank failed and said why; this one stops with it, quietly, with status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


class OneProcess:
    """The group of a run that is not data-parallel: reductions are the identity."""

    rank, size = 0, 1
    ranks_on_this_node = 1  # the ranks that share this machine's memory, this one included

    def allreduce_sum(self, buffer: np.ndarray) -> None:
        pass

    def least_free_memory(self) -> int | None:
        """The least bytes any rank reads free (memory.available_bytes), or None if unknown."""
        return memory.available_bytes()

    def broadcast(self, array: np.ndarray) -> None:
        pass

    def abort(self, code: int) -> None:
        pass


class MPIGroup(OneProcess):
    def __init__(self) -> None:
        from mpi4py import MPI

        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED)  # the ranks that share memory
        self.ranks_on_this_node = node.Get_size()
        node.Free()

    def allreduce_sum(self, buffer: np.ndarray) -> None:
        self.comm.Allreduce(self.MPI.IN_PLACE, buffer, op=self.MPI.SUM)

    def least_free_memory(self) -> int | None:
        """Read once every rank holds its model (a barrier), and before any takes a step
        (the minimum is a collective): the same number on every rank, so all decide alike."""
        self.comm.Barrier()
        free = memory.available_bytes()
        least = self.comm.allreduce(UNKNOWN if free is None else free, op=self.MPI.MIN)
        return None if least == UNKNOWN else least

    def broadcast(self, array: np.ndarray) -> None:
        self.comm.Bcast(array, root=0)

    def abort(self, code: int) -> None:
        self.comm.Abort(code)  # ends every rank: nobody is left waiting in a collective


def launched_ranks() -> int:
    """How many processes mpiexec started (1 when not under mpiexec)."""
    return max(int(os.environ.get(name, "1")) for name in RANK_COUNT_VARIABLES)


def launched_rank() -> int:
    """This process's rank as mpiexec numbered it (0 when not under mpiexec)."""
    return max(int(os.environ.get(name, "0")) for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"))


def process_group(data_parallel: bool) -> OneProcess:
    if not data_parallel:
        if launched_ranks() > 1:
            if launched_rank() > 0:
                raise PeerStopped("refused by rank 0", status=2)  # one line, from rank 0
            raise InputError(
                f"{launched_ranks()} ranks were launched without --data-parallel: each would "
                "train the same run and overwrite the others' checkpoints"
            )
        return OneProcess()
    try:
        return MPIGroup()
    except ImportError:
        raise InputError("--data-parallel needs the mpi extra: pip install -e '.[mpi]'") from None


@dataclass
class DataParallel:
    """How one optimizer step's gradient is computed: over group's ranks, in accumulate
    micro-batches on each."""

    group: OneProcess
    accumulate: int = 1
    _kept: tuple = field(default=(), init=False, repr=False)  # see _buffers

    def __post_init__(self) -> None:
        if isinstance(self.accumulate, bool) or not isinstance(self.accumulate, int):
            raise InputError(f"accumulate must be a positive int, got {self.accumulate!r}")
        if self.accumulate < 1:
            raise InputError(f"accumulate must be a positive int, got {self.accumulate}")

    def check_batch_size(self, batch_size: int) -> None:
        """Refuse ranks or micro-batches that a batch has too few rows for: share would give
        a rank no rows, or make fewer micro-batches than asked on every rank."""
        ranks = self.group.size
        if ranks > batch_size:
            raise InputError(
                f"{ranks} ranks share a batch of batch_size={batch_size}: "
                f"{ranks - batch_size} of them would have no rows"
            )
        largest_share = math.ceil(batch_size / ranks)
        if self.accumulate > largest_share:
            rows = f"batch_size={batch_size} rows"
            share = (
                f"a rank's share ({rows} over {ranks} ranks)" if ranks > 1 else f"a batch of {rows}"
            )
            raise InputError(
                f"accumulate={self.accumulate} is more micro-batches than {share} makes: "
                f"at most {largest_share}, of one row each"
            )

    @property
    def is_root(self) -> bool:
        return self.group.rank == 0

    @property
    def plain(self) -> bool:
        """One process, one batch: the loop's direct path, no scaling or reduction."""
        return self.group.size == 1 and self.accumulate == 1

    def _buffers(self, model) -> tuple[np.ndarray, dict, np.ndarray]:
        """(the reduced vector, P + 3; its views shaped like model.params; a scratch as large
        as the largest parameter, for one n x gradient at a time), made once and reused every
        step: a step of GPT-2 would otherwise fault in fresh pages, and a whole flat copy of
        each micro-batch's gradient would cost 500 MB more on it."""
        P, dtype = model.flat.size, model.flat.dtype
        kept = self._kept
        if not kept or kept[0].size != P + 3 or kept[0].dtype != dtype:
            reduced = np.empty(P + 3, dtype)
            largest = max(p.size for p in model.params.values())
            self._kept = (reduced, unflatten(reduced[:P], model.params), np.empty(largest, dtype))
        return self._kept

    def share(self, batch: tuple) -> list[tuple]:
        """This rank's rows of the global batch (B, ...) arrays, cut into micro-batches."""
        rows = np.array_split(np.arange(len(batch[0])), self.group.size)[self.group.rank]
        parts = np.array_split(rows, self.accumulate)
        return [tuple(array[part] for array in batch) for part in parts if len(part)]

    def micro_batch_rows(self, batch_size: int) -> int:
        """The most rows a micro-batch of share's takes from a batch of batch_size rows (its
        array_splits give the first parts the extra row): ceil(ceil(B / ranks) / K)."""
        rank_rows = math.ceil(batch_size / self.group.size)
        return math.ceil(rank_rows / self.accumulate)

    def gradient(self, model, batch: tuple, local_step) -> tuple[float, np.ndarray]:
        """(the global mean loss, the global mean gradient as a flat vector) of one step.
        local_step(micro_batch, part) -> (loss, grads) is the loop's guarded loss_and_grads;
        part numbers the step's micro-batches over every rank (each its own dropout masks)."""
        P = model.flat.size
        reduced, summed, scratch = self._buffers(model)
        reduced[...] = 0.0  # [n g ..., n, n loss, failures]
        failure = None
        try:
            first_part = self.group.rank * self.accumulate
            for part, micro in enumerate(self.share(batch), start=first_part):
                n = model.count_targets(micro[-1])
                if n == 0:
                    continue  # a share with no counted target adds nothing
                loss, grads = local_step(micro, part)
                add_scaled(summed, grads, n, scratch)
                del grads  # now: kept, it would be a second set while the next one is made
                reduced[P] += n
                reduced[P + 1] += loss * n
        except Exception as error:  # any: the other ranks must not wait for this one
            failure, reduced[P + 2] = error, 1
            error.on_this_rank_only = True  # the others stop with PeerStopped, quietly
        self.group.allreduce_sum(reduced)
        if failure is not None:
            raise failure
        if reduced[P + 2] > 0:
            raise PeerStopped("another rank stopped this step")
        count = reduced[P]
        if count == 0:
            raise InputError("every target of the global batch is ignored: no loss")
        grads = reduced[:P]
        grads /= count
        return float(reduced[P + 1] / count), grads


def add_scaled(summed: dict, grads: dict, n: int, scratch: np.ndarray) -> None:
    """summed[key] += n * grads[key] for every key, n * grads[key] made in scratch (its first
    entries). grads must have summed's keys, in order, and shapes."""
    if list(grads) != list(summed):
        raise InputError("grads must have exactly the model's parameter keys, in order")
    for (key, total), grad in zip(summed.items(), grads.values(), strict=True):
        if grad.shape != total.shape:
            raise InputError(f"grads[{key!r}] must have shape {total.shape}, got {grad.shape}")
        total += np.multiply(grad, n, out=scratch[: grad.size].reshape(grad.shape))


def run_as_rank(parallel: DataParallel, body, command: str) -> int:
    """body() on this rank of a data-parallel run, so that an error ends every rank with one
    message: a failure inside a step's gradient is raised where it happened and the other
    ranks stop quietly (PeerStopped); any other error is said by rank 0 (or by the rank it
    happened on alone), and then MPI_Abort ends every rank, so none waits in a collective.
    Ctrl-C likewise: mpiexec passes it to every rank, and a rank that left on its own would
    leave the others waiting for it in the step's sum (numpy_engine/stopping.py)."""
    from numpy_engine.cli_args import failure

    try:
        return body()
    except PeerStopped:
        raise
    except KeyboardInterrupt:
        if parallel.group.size == 1:
            raise  # one process: the command line's own message and status
        _abort_every_rank(parallel, f"numpy-engine {command}: interrupted", 128 + signal.SIGINT)
    except Exception as error:
        if getattr(error, "on_this_rank_only", False) or parallel.group.size == 1:
            raise  # the others are stopping too: the usual message and status
        message, status = failure(command, error)
        message = message or f"numpy-engine {command}: {error!r}"
        _abort_every_rank(parallel, message, status or 1, alone=True)


def _abort_every_rank(parallel: DataParallel, message: str, status: int, alone=False) -> None:
    """Say message, then end every rank with MPI_Abort. Rank 0 says it at once; another rank
    first waits a grace, in which rank 0's Abort ends it when rank 0 met the same (bad flags,
    a missing file, Ctrl-C: every rank meets them), and then says it naming itself (`alone`:
    an error only this rank met)."""
    if not parallel.is_root:
        time.sleep(ABORT_GRACE_SECONDS)
        message += f" (on rank {parallel.group.rank}{' alone' if alone else ''})"
    print(message, file=sys.stderr)
    sys.stderr.flush()
    wait_until_read(sys.stderr.fileno(), STDERR_READ_WAIT_SECONDS)
    parallel.group.abort(status)
    os._exit(status)  # MPICH's Abort can return to its caller: never run on


def wait_until_read(fd: int, seconds: float) -> None:
    """Wait until the reader of the pipe that fd writes into (mpiexec's proxy) has read all
    of it, or until seconds pass. MPI_Abort ends the run at once, and what the proxy had not
    read yet is lost: under load, rank 0's message was lost in 4 of 100 aborts without this
    wait."""
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        return  # a file or a terminal keeps what was written
    deadline = time.monotonic() + seconds
    while unread_bytes(fd) > 0 and time.monotonic() < deadline:
        time.sleep(0.005)


def unread_bytes(pipe_fd: int) -> int:
    """Bytes written into the pipe and not read yet (Linux's FIONREAD, on either end)."""
    import fcntl
    import termios

    return struct.unpack("i", fcntl.ioctl(pipe_fd, termios.FIONREAD, b"\0" * 4))[0]
