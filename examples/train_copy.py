"""Train the encoder-decoder to copy short sequences, with plain gradient descent.

Run: python examples/train_copy.py
Every gradient comes from the hand-written backward passes in numpy_engine.
"""

import itertools

import numpy as np

import numpy_engine as ne

PAD, BOS, EOS = 0, 1, 2
SYMBOLS = range(4, 12)

# Every sequence of 1 to 3 symbols: source, decoder input [BOS] + seq, target seq + [EOS].
sequences = [s for n in (1, 2, 3) for s in itertools.product(SYMBOLS, repeat=n)]
source = np.array([list(s) + [PAD] * (3 - len(s)) for s in sequences])  # (584, 3)
decoder_input = np.array([[BOS, *s] + [PAD] * (3 - len(s)) for s in sequences])  # (584, 4)
target = np.array([[*s, EOS] + [PAD] * (3 - len(s)) for s in sequences])  # (584, 4)

model = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(), seed=0)
rng = np.random.default_rng(0)
lr, steps = 0.1, 200
for step in range(1, steps + 1):
    batch = rng.integers(0, len(sequences), size=32)
    loss, grads = model.loss_and_grads(source[batch], decoder_input[batch], target[batch])
    for key in model.params:
        model.params[key] -= lr * grads[key]
    if step == 1 or step % 50 == 0:
        print(f"step {step:4d}  loss {loss:.4f}")

logits, _ = model.forward(source, decoder_input)
counted = target != PAD
accuracy = ((logits.argmax(-1) == target) & counted).sum() / counted.sum()
print(f"teacher-forced token accuracy on all {len(sequences)} sequences: {accuracy:.3f}")
