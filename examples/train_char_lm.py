"""Train MiniGPT, a decoder-only transformer, to continue a line of Hamlet character by character.

Run: python examples/train_char_lm.py    (about 15 seconds on one CPU core)
The same run as `numpy-engine train char-lm`, written out step by step. Its losses match the
command's to float32 rounding (step 4: 2.2174292 in both), and the two drift apart as
training goes on (step 50: 0.4853 against 0.4852): the command folds the clipping into
the optimizer's update (`optimizer.step(model.flat, grads, max_grad_norm=1.0)`), which
rounds differently from scaling the gradient first, as this script does.
"""

import numpy as np

import numpy_engine as ne
from numpy_engine.generate import generate
from numpy_engine.optim import AdamW, clip_grad_norm, no_decay_keys
from numpy_engine.tasks import DEFAULT_TEXT, CharCorpus

SEED, STEPS, BATCH_SIZE, CONTEXT = 7, 300, 32, 32

corpus = CharCorpus(DEFAULT_TEXT)  # "to be or not to be that is the question " * 50: 13 characters
config = ne.GPTConfig(vocab_size=corpus.vocab_size, max_len=CONTEXT)  # d_model 64, 3 layers
model = ne.MiniGPT(config, seed=SEED)
# weight decay on the matrices and embeddings, not on biases and layernorms (as the command)
optimizer = AdamW(model.params, lr=3e-3, weight_decay=0.01, no_decay=no_decay_keys(model.params))
sampler = np.random.default_rng([SEED, 1])

for step in range(1, STEPS + 1):
    idx, targets = corpus.batch(sampler, BATCH_SIZE, CONTEXT)  # targets: idx shifted by one
    loss, grads = model.loss_and_grads(idx, targets)
    flat_grads = model.flat_grads(grads)  # one vector, laid out like model.flat
    clip_grad_norm(flat_grads, max_norm=1.0)  # scales flat_grads in place
    optimizer.step(model.flat, flat_grads)  # updates model.flat, which model.params views
    if step == 1 or step % 50 == 0:
        print(f"step {step:4d}  loss {loss:.4f}   (uniform guessing: ln 13 = {np.log(13):.4f})")

prompt = corpus.encode("to ")
print("greedy:", repr(corpus.decode(generate(model, prompt, max_new_tokens=60)[0])))
sampled = generate(model, prompt, max_new_tokens=60, temperature=0.8, top_k=5, seed=0)
print("sampled (T=0.8, top-k 5):", repr(corpus.decode(sampled[0])))
