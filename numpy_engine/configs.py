"""The training runs' configurations, frozen dataclasses whose defaults the command line's
options come from. (Each model kind's config lives with its model, in numpy_engine/models/.)"""

from __future__ import annotations

from dataclasses import dataclass

from numpy_engine.optim import Adam, AdamW, Optimizer, no_decay_keys


@dataclass(frozen=True)
class SequenceTrainConfig:
    task: str = "copy"  # or "reverse"
    steps: int = 800
    seed: int = 7
    lr: float = 1e-3
    batch_size: int = 32
    clip: float = 1.0
    eval_every: int = 100
    schedule: str = "constant"  # the lr's course: constant, linear or cosine (schedule.py)
    warmup: int = 0  # the first updates, whose lr rises from 0 towards lr
    min_lr: float = 0.0  # where linear and cosine decay towards
    dropout: float | None = None  # every dropout site's rate (dropout.py); None: the model's, 0

    # not a field: what optimizer() makes (step_memory.check_step_fits reads it)
    optimizer_class = Adam

    def optimizer(self, params: dict) -> Optimizer:
        return self.optimizer_class(params, lr=self.lr)


@dataclass(frozen=True)
class CharTrainConfig:
    steps: int = 300
    seed: int = 7
    lr: float = 3e-3
    batch_size: int = 32
    context: int = 32
    clip: float = 1.0
    weight_decay: float = 0.01
    weight_decay_on: str = "matrices"  # or "all": WEIGHT_DECAY_ON
    prompt: str | None = None  # the sample's prompt; None: the text's first 3 characters
    model: str = "gpt"  # the kind of model trained: any registered kind that continues a prompt
    task: str = "char-lm"  # the name it is registered under in REFERENCE_RUNS
    init: str | None = None  # a checkpoint to start from (its weights and tokenizer)
    holdout: float = 0.0  # the text's last fraction of tokens, evaluated on, never trained on
    eval_every: int = 100  # with a holdout: its loss every N steps (and at the last)
    schedule: str = "constant"  # the lr's course: constant, linear or cosine (schedule.py)
    warmup: int = 0  # the first updates, whose lr rises from 0 towards lr
    min_lr: float = 0.0  # where linear and cosine decay towards
    # every dropout site's rate in the model's training steps (dropout.py); None: the model's
    # own rates (a new model's 0, an imported GPT-2's from its config.json)
    dropout: float | None = None

    optimizer_class = AdamW  # not a field: what optimizer() makes
    # settings added since some runs were saved, with the values those runs were trained with
    # where they are not the defaults (saved_runs.saved_config): they decayed every parameter
    older_runs_had = {"weight_decay_on": "all"}

    def optimizer(self, params: dict) -> Optimizer:
        no_decay = no_decay_keys(params) if self.weight_decay_on == "matrices" else ()
        return self.optimizer_class(
            params, lr=self.lr, weight_decay=self.weight_decay, no_decay=no_decay
        )


# Which parameters AdamW's weight decay shrinks in a language model's run: "matrices", the
# weight matrices and embedding tables (optim.no_decay_keys: not the biases nor layernorms'
# scales and shifts, as Hugging Face's Trainer and nanoGPT), or "all" (as torch.optim.AdamW
# given model.parameters(); the runs saved before the choice was made)
WEIGHT_DECAY_ON = ("matrices", "all")


# The training tasks, by name: what `numpy-engine train TASK` runs without flags. A new task
# (a language model of another kind on text, say) is one more entry.
REFERENCE_RUNS = {
    "copy": SequenceTrainConfig(task="copy"),
    "reverse": SequenceTrainConfig(task="reverse", steps=1000),
    "char-lm": CharTrainConfig(),
    # fine-tune a language model from a checkpoint (`--init RUN`: e.g. GPT-2 from import-hf)
    "lm": CharTrainConfig(task="lm", steps=100, lr=1e-4, batch_size=4, context=64, model="gpt2"),
}

# A task whose run from a new model needs other defaults than its reference run's. `train lm`
# without --init trains a small GPT-2 from scratch on the text's characters, so at char-lm's
# pace: its lr and steps, and its 1,024 tokens a step as 16 windows of lm's 64 (a new model's
# max_len is its context: a fine-tuning run at lm's defaults can start from it). At lm's
# fine-tuning defaults (lr 1e-4, 100 steps of 4 x 64) a new model's loss on the built-in line
# went from 2.59 to 2.20 and its greedy sample was "to t t t t ..."; at these, to 0.09 and
# "to be that is the question to be or not to be ...".
NEW_MODEL_RUNS = {"lm": CharTrainConfig(task="lm", model="gpt2", batch_size=16, context=64)}


def reference_run(task: str, new_model: bool):
    """The defaults of `numpy-engine train TASK`: NEW_MODEL_RUNS' entry for a run that starts
    from a new model (no --init) when the task has one, else REFERENCE_RUNS'."""
    if new_model and task in NEW_MODEL_RUNS:
        return NEW_MODEL_RUNS[task]
    return REFERENCE_RUNS[task]
