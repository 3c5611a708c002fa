"""Fine-tune GPT-2 on a line of Hamlet with hand-written gradients: no autograd anywhere.

Run: python examples/finetune_gpt2.py [GPT2_DIR] [TEXT_FILE]
GPT2_DIR: a Hugging Face GPT-2 directory (config.json, model.safetensors, tokenizer.json;
see the README for how to get the real gpt2), read as `numpy-engine import-hf` reads it
(the hf extra). Without one, a small random GPT-2 over the text's characters is built
here, offline, so the script always runs (about a second on one CPU core).
"""

import argparse
import tempfile

import numpy as np

from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.checks import InputError
from numpy_engine.dropout import training_rng
from numpy_engine.evaluation import heldout_loss
from numpy_engine.generate import generate
from numpy_engine.models import GPT2, GPT2Config
from numpy_engine.optim import AdamW, no_decay_keys
from numpy_engine.tasks import (
    DEFAULT_TEXT,
    CharCorpus,
    corpus_from_meta,
    every_target_once,
    random_windows,
    read_text,
    split_off_heldout,
)

SEED, STEPS, BATCH_SIZE, CONTEXT, HOLDOUT = 7, 200, 8, 32, 0.1
parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
parser.add_argument(
    "gpt2_dir", nargs="?", metavar="GPT2_DIR", help="a Hugging Face GPT-2 directory"
)
parser.add_argument("text_file", nargs="?", metavar="TEXT_FILE", help="a UTF-8 text to train on")
args = parser.parse_args()
try:  # a missing, malformed or too short file: one line naming it, exit 2, as the command line
    text = read_text(args.text_file) if args.text_file else DEFAULT_TEXT
    if args.gpt2_dir:  # the real thing: weights and tokenizer from the directory
        from numpy_engine.hf import import_hf

        with tempfile.TemporaryDirectory() as run:
            checkpoint = load_checkpoint(import_hf(args.gpt2_dir, run))
        model, corpus = checkpoint.model, corpus_from_meta(checkpoint.meta, text)  # its tokenizer
        lr = 1e-4
    else:  # offline: GPT-2's architecture and initialisation, a character vocabulary
        corpus = CharCorpus(text)
        model = GPT2(GPT2Config(vocab_size=corpus.vocab_size, max_len=CONTEXT), seed=SEED)
        lr = 3e-3
    context = min(CONTEXT, model.config.max_len)  # a small model may see fewer positions
    # the text's last tenth is held out: never trained on, every token of it a target once
    train_ids, heldout_ids = split_off_heldout(corpus.ids, HOLDOUT, context)
except InputError as error:
    parser.error(str(error))
print(f"GPT-2 with {model.num_parameters():,} parameters; {len(corpus.ids):,} tokens of text")
heldout = every_target_once(heldout_ids, context, model.ignore_index())
print(f"held-out loss before: {heldout_loss(model, heldout, BATCH_SIZE):.4f}")

# weight decay on the matrices and embeddings, not on biases and layernorms (as the command)
optimizer = AdamW(model.params, lr=lr, weight_decay=0.01, no_decay=no_decay_keys(model.params))


def train_step(step: int, idx: np.ndarray, targets: np.ndarray) -> float:
    """One AdamW step; returns the loss. The gradients go when it returns: kept in the loop,
    they would still be held while the next step makes its own (500 MB more for gpt2).
    Dropout at the model's rates (an imported gpt2's 0.1; the small model here has none),
    its masks from the step's own generator, as `numpy-engine train` draws them."""
    dropout_rng = training_rng(SEED, step)
    loss, grads = model.loss_and_grads(idx, targets, dropout_rng)  # dwte: embedding + head
    optimizer.step(model.flat, grads, max_grad_norm=1.0)  # clips, then updates model.flat
    return loss


sampler = np.random.default_rng([SEED, 1])
for step in range(1, STEPS + 1):
    idx, targets = random_windows(train_ids, sampler, BATCH_SIZE, context)  # targets: idx + 1
    loss = train_step(step, idx, targets)
    if step == 1 or step % 40 == 0:
        print(f"step {step:3d}  loss {loss:.4f}", flush=True)

print(f"held-out loss after: {heldout_loss(model, heldout, BATCH_SIZE):.4f}")
prompt = corpus.encode(text[:6])
print("greedy:", repr(corpus.decode(generate(model, prompt, max_new_tokens=30)[0])))
