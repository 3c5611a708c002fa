"""Runs for the data-parallel tests, started by test_parallel.py under `mpiexec -n N`:

python -m parity_tests.mpi_runs gpt|copy OUT.npz [K]
    float64, 10 steps (AdamW with clipping on MiniGPT, Adam on the copy model), padded
    batches whose ignored targets fall unevenly on the ranks, K micro-batches a step; OUT
    gets the final parameters and whether every rank held the same bits after every step
python -m parity_tests.mpi_runs nan
    train char-lm --data-parallel, with a NaN loss on rank 1 from its third step on
python -m parity_tests.mpi_runs short-of-memory
    train char-lm --data-parallel, rank 1 reading too little free memory for both ranks
python -m parity_tests.mpi_runs late-model MARKER
    the same, rank 1 building its model late, rank 0's free memory falling when it has
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np

import numpy_engine as ne
from numpy_engine.configs import CharTrainConfig, SequenceTrainConfig
from numpy_engine.loop import TrainState, empty_history, run_loop
from numpy_engine.parallel import DataParallel, MPIGroup, OneProcess
from numpy_engine.tasks import DEFAULT_TEXT, CharCorpus, sequence_task

STEPS = 10


def gpt_run():
    corpus = CharCorpus(DEFAULT_TEXT)
    config = ne.GPTConfig(vocab_size=corpus.vocab_size, n_layers=2, max_len=16, dtype="float64")
    model = ne.MiniGPT(config, seed=3)
    cfg = CharTrainConfig(steps=STEPS, batch_size=8, context=16, lr=3e-3, clip=0.5)

    def next_batch(sampler):
        idx, targets = corpus.batch(sampler, 8, 16)
        targets = targets.copy()
        targets[1, 5:] = -100  # rank 0's share: one row half ignored
        targets[5:, 3:] = -100  # rank 1's share: three rows mostly ignored
        return idx, targets

    return model, cfg, next_batch


def copy_run():
    task = sequence_task("copy", seed=7)
    model = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(dtype="float64"), seed=7)
    cfg = SequenceTrainConfig(steps=STEPS, batch_size=6)

    def next_batch(sampler):  # 1-3 symbols a row: padding varies across the shares
        return task.train.take(sampler.integers(0, len(task.train), size=6))

    return model, cfg, next_batch


def train(
    scenario: str, parallel: DataParallel | None, history: dict | None = None
) -> tuple[np.ndarray, list[str]]:
    """The final flat parameters, and a hash of them after every step; history (if given)
    gets the run's losses and norms. Every rank but 0 starts from other weights: run_loop
    gives each rank rank 0's."""
    model, cfg, next_batch = {"gpt": gpt_run, "copy": copy_run}[scenario]()
    if parallel is not None and parallel.group.rank > 0:
        model.flat += 1.0
    optimizer = cfg.optimizer(model.params)
    hashes = []
    step = optimizer.step

    def step_and_hash(*args, **kwargs):
        norm = step(*args, **kwargs)
        hashes.append(hashlib.sha256(model.flat.tobytes()).hexdigest())
        return norm

    optimizer.step = step_and_hash
    history = empty_history() if history is None else history
    state = TrainState(model, optimizer, np.random.default_rng([7, 1]), 0, history)
    run_loop(state, cfg, next_batch, None, None, None, lambda s: {}, parallel)
    return model.flat.copy(), hashes


def nan_on_rank_1() -> int:
    """train char-lm --data-parallel, rank 1's loss NaN from its third micro-batch on."""
    from numpy_engine.cli import main as cli_main
    from numpy_engine.parallel import launched_rank

    if launched_rank() == 1:
        calls = {"n": 0}
        loss_and_grads = ne.MiniGPT.loss_and_grads

        def poisoned(self, idx, targets):
            calls["n"] += 1
            loss, grads = loss_and_grads(self, idx, targets)
            return (float("nan") if calls["n"] >= 3 else loss), grads

        ne.MiniGPT.loss_and_grads = poisoned
    return cli_main(["train", "char-lm", "--data-parallel", "--steps", "20", "--quiet"])


def disk_full_on_rank_0(out: str) -> int:
    from numpy_engine import loop
    from numpy_engine.cli import main as cli_main
    from numpy_engine.parallel import launched_rank

    if launched_rank() == 0:
        writes = {"n": 0}
        save = loop.save_checkpoint

        def failing(*args, **kwargs):
            writes["n"] += 1
            if writes["n"] == 2:
                raise OSError(28, "No space left on device")
            return save(*args, **kwargs)

        loop.save_checkpoint = failing
    args = ["train", "char-lm", "--data-parallel", "--steps", "200", "--quiet", "--out", out]
    return cli_main([*args, "--checkpoint-every", "5"])


def char_lm_with_memory(step_bytes, available_bytes) -> int:
    """train char-lm --data-parallel with the memory check's two readings replaced: what a
    rank's step is counted at (step_memory.step_bytes) and what it reads free."""
    from numpy_engine import memory, step_memory
    from numpy_engine.cli import main as cli_main

    step_memory.step_bytes, memory.available_bytes = step_bytes, available_bytes
    return cli_main(["train", "char-lm", "--data-parallel", "--steps", "5", "--quiet"])


def short_of_memory_on_rank_1() -> int:
    """Each rank's step counted at 1 GiB: rank 0 reads 100 GiB free, rank 1 reads 1.5,
    enough for one rank's step but not for both ranks'."""
    from numpy_engine.parallel import launched_rank

    free = 100 * 2**30 if launched_rank() == 0 else 3 * 2**29
    return char_lm_with_memory(lambda *args: 2**30, lambda: free)


def model_built_late_on_rank_1(marker: str) -> int:
    """Each rank's step counted at 1 GiB, both ranks reading 100 GiB free, except that once
    rank 1 has built its model (it takes a second: the marker file is written then) rank 0
    reads 1.5 GiB: rank 1's model took the rest. Only if rank 0 reads after that do the two
    ranks refuse together."""
    import os
    import time

    from numpy_engine.parallel import launched_rank

    def step_bytes(*args):
        if launched_rank() == 1:
            time.sleep(1.0)  # building its model, late
            open(marker, "w").close()
        return 2**30

    def available_bytes():  # rank 1 itself reads 100 GiB: only rank 0's reading can refuse
        taken = launched_rank() == 0 and os.path.exists(marker)
        return 3 * 2**29 if taken else 100 * 2**30

    return char_lm_with_memory(step_bytes, available_bytes)


def failure_on_rank_1_alone() -> int:
    """A bug (an unexpected kind of error) on rank 1 alone, outside any step, while rank 0
    waits in a collective for it."""
    from numpy_engine.parallel import run_as_rank

    parallel = DataParallel(MPIGroup())

    def body() -> int:
        if parallel.group.rank == 1:
            raise RuntimeError("rank 1's own failure")
        parallel.group.allreduce_sum(np.zeros(1))  # rank 0 waits here for rank 1
        return 0

    return run_as_rank(parallel, body, "train")


def main(argv: list[str]) -> int:
    scenario = argv[0]
    if scenario == "nan":
        return nan_on_rank_1()
    if scenario == "short-of-memory":
        return short_of_memory_on_rank_1()
    if scenario == "late-model":
        return model_built_late_on_rank_1(argv[1])
    if scenario == "rank-1-alone":
        return failure_on_rank_1_alone()
    if scenario == "disk-full":
        return disk_full_on_rank_0(argv[1])
    out, accumulate = argv[1], int(argv[2]) if len(argv) > 2 else 1
    from numpy_engine.parallel import launched_ranks

    group = MPIGroup() if launched_ranks() > 1 else OneProcess()
    flat, hashes = train(scenario, DataParallel(group, accumulate))
    every_rank = group.comm.gather(hashes, root=0) if group.size > 1 else [hashes]
    if group.rank == 0:
        same = all(h == every_rank[0] for h in every_rank)
        np.savez(out, flat=flat, same_on_every_rank=same, ranks=group.size)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
