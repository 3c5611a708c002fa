"""Training-step speed and memory: the engine against torch_reference, in the same run.

    python -m benchmarks.train_step                      # all configs, one BLAS thread
    python -m benchmarks.train_step --configs copy --steps 50 --no-memory
    numpy-engine bench                                   # the same, installed

The work is in benchmarks/bench.py; the flags are `numpy-engine bench`'s, defined once in
crosscheck/cli.py.
"""

from __future__ import annotations

import sys

from crosscheck.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
