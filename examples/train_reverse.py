"""Teach the encoder-decoder to reverse sequences of 1-3 symbols, with hand-written gradients.

Run: python examples/train_reverse.py    (about 4 seconds on one CPU core)
The same run as `numpy-engine train reverse`, written out step by step.
"""

import numpy as np

import numpy_engine as ne
from numpy_engine.generate import greedy_decode
from numpy_engine.optim import Adam, clip_grad_norm
from numpy_engine.tasks import sequence_task

SEED, STEPS, BATCH_SIZE = 7, 1000, 32

# Every sequence of 1..3 symbols (ids 4..11), split 467 / 117. Rows look like
#   source [5, 9, 0]   decoder input [BOS, 9, 5, 0]   target [9, 5, EOS, 0]   (0 = PAD)
task = sequence_task("reverse", seed=SEED)
model = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(), seed=SEED)  # float32, 4 heads, d_model 32
optimizer = Adam(model.params, lr=1e-3)
sampler = np.random.default_rng([SEED, 1])

for step in range(1, STEPS + 1):
    rows = sampler.integers(0, len(task.train), size=BATCH_SIZE)
    source, decoder_input, target = task.train.take(rows)
    loss, grads = model.loss_and_grads(source, decoder_input, target)  # forward + backward
    flat_grads = model.flat_grads(grads)  # one vector, laid out like model.flat
    grad_norm = clip_grad_norm(flat_grads, max_norm=1.0)  # scales flat_grads in place
    optimizer.step(model.flat, flat_grads)  # updates model.flat, which model.params views
    if step == 1 or step % 100 == 0:
        print(f"step {step:4d}  loss {loss:.4f}  gradient norm {grad_norm:.3f}")

# Greedy decoding on the held-out sequences the model never saw.
generated = greedy_decode(model, task.test.source, max_new_tokens=4)
exact = (generated == task.test.target).all(axis=1)
print(f"held-out exact match: {exact.mean():.3f} ({exact.sum()} of {len(exact)})")
for source, output in zip(task.test.source[:3], generated[:3], strict=True):
    print("  source", source.tolist(), "-> generated", output.tolist())
