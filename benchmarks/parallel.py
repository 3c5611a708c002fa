"""Data-parallel throughput: the engine on 1 and 2 MPI ranks against PyTorch DDP (gloo, 2
processes), the same workload, one BLAS thread per process, in the same run.

    numpy-engine bench --data-parallel      (or python -m benchmarks.parallel)

Each engine rank takes its share of the same global batch (numpy_engine/parallel.py); each
DDP process takes the same share of the same batch. Reported: training steps per second
(forward, backward, the reduction, clipping at 1.0, the optimizer), timed on rank 0 over
the steps after a warm-up.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.workloads import WORKLOADS, build, steps_argument

CONFIGS = ("char-lm", "large")
ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def engine_rank(name: str, steps: int) -> None:
    """Under mpiexec: train `steps` steps of the workload data-parallel; rank 0 prints steps/s."""
    from numpy_engine.loop import TrainState, step_gradient
    from numpy_engine.memory import keep_freed_memory
    from numpy_engine.parallel import DataParallel, MPIGroup, OneProcess, launched_ranks

    keep_freed_memory()
    group = MPIGroup() if launched_ranks() > 1 else OneProcess()
    parallel = DataParallel(group)
    model, optimizer, batches = build(WORKLOADS[name], steps + 2)
    group.broadcast(model.flat)
    state = TrainState(model, optimizer, None)
    for i, batch in enumerate(batches):
        if i == 2:  # after two warm-up steps
            if group.size > 1:
                group.comm.Barrier()
            start = time.perf_counter()
        _, grads = step_gradient(state, i + 1, batch, parallel)
        optimizer.step(model.flat, grads, max_grad_norm=1.0)
    if group.rank == 0:
        print(steps / (time.perf_counter() - start))


def ddp_rank(rank: int, size: int, name: str, steps: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from crosscheck.convert import tensor, torch_model_for

    torch.set_num_threads(1)
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    dist.init_process_group("gloo", rank=rank, world_size=size)
    model, _, batches = build(WORKLOADS[name], steps + 2)
    module = DistributedDataParallel(torch_model_for(model))
    optimizer = getattr(torch.optim, WORKLOADS[name].optimizer.__name__)(
        module.parameters(), lr=1e-3
    )
    for i, batch in enumerate(batches):
        if i == 2:
            dist.barrier()
            start = time.perf_counter()
        rows = slice(rank * len(batch[0]) // size, (rank + 1) * len(batch[0]) // size)
        optimizer.zero_grad(set_to_none=True)
        logits = module(tensor(batch[0][rows]))
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), tensor(batch[1][rows]).flatten(), ignore_index=-100
        )
        loss.backward()  # DDP averages the gradients over the processes here
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
    if rank == 0:
        Path(out).write_text(str(steps / (time.perf_counter() - start)))
    dist.destroy_process_group()


def engine_steps_per_second(name: str, steps: int, ranks: int) -> float:
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    code = f"from benchmarks.parallel import engine_rank; engine_rank({name!r}, {steps})"
    command = [mpiexec, "-n", str(ranks), sys.executable, "-c", code]
    env = os.environ | ONE_THREAD
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return float(out.stdout.strip().splitlines()[-1])


def ddp_steps_per_second(name: str, steps: int, processes: int = 2) -> float:
    import tempfile

    import torch.multiprocessing as mp

    os.environ.update(ONE_THREAD)
    with tempfile.TemporaryDirectory() as directory:
        out = str(Path(directory) / "rate")
        mp.spawn(ddp_rank, args=(processes, name, steps, 29511, out), nprocs=processes)
        return float(Path(out).read_text())


def run(configs: list[str], steps: int) -> dict:
    results = {}
    for name in configs:
        n = max(4, steps // 5) if name == "large" else steps
        one = engine_steps_per_second(name, n, 1)
        two = engine_steps_per_second(name, n, 2)
        ddp = ddp_steps_per_second(name, n)
        results[name] = {"engine_1": one, "engine_2": two, "torch_ddp_2": ddp, "steps": n}
    return results


def table(results: dict) -> str:
    lines = [
        "data-parallel, one BLAS thread a process: training steps per second",
        f"{'config':<8} {'engine 1 rank':>14} {'engine 2 ranks':>15} {'speed-up':>9} "
        f"{'torch DDP 2':>12} {'engine/DDP':>11}",
    ]
    for name, r in results.items():
        lines.append(
            f"{name:<8} {r['engine_1']:>14.2f} {r['engine_2']:>15.2f} "
            f"{r['engine_2'] / r['engine_1']:>9.2f} {r['torch_ddp_2']:>12.2f} "
            f"{r['engine_2'] / r['torch_ddp_2']:>11.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    steps = steps_argument(
        argv, "python -m benchmarks.parallel", __doc__, 40, "timed steps per run"
    )
    print(table(run(list(CONFIGS), steps)))


if __name__ == "__main__":
    main()
