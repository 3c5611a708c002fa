"""Configurations, frozen dataclasses: the models' (checked when they are made) and the training
runs', whose defaults the command line's options come from."""

from __future__ import annotations

from dataclasses import dataclass

from numpy_engine import checks
from numpy_engine.checks import InputError
from numpy_engine.layers import ACTIVATIONS

DTYPES = ("float32", "float64")

# ------------------------------------------------------------------------- configs


def _check_sizes(config: object, names: tuple[str, ...]) -> None:
    for name in names:
        checks.check_positive_int(name, getattr(config, name))
    if config.d_model % config.n_heads != 0:
        raise InputError(f"d_model={config.d_model} must be divisible by n_heads={config.n_heads}")
    checks.check_choice("activation", config.activation, tuple(ACTIVATIONS))
    checks.check_choice("dtype", config.dtype, DTYPES)


@dataclass(frozen=True)
class Seq2SeqConfig:
    vocab_size: int = 12
    d_model: int = 32
    n_heads: int = 4
    d_ff: int = 64
    n_encoder_layers: int = 1
    n_decoder_layers: int = 1
    activation: str = "relu"
    pad_id: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        sizes = ("vocab_size", "d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers")
        _check_sizes(self, sizes)
        if not 0 <= self.pad_id < self.vocab_size:
            raise InputError(f"pad_id={self.pad_id} must be in [0, vocab_size={self.vocab_size})")


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 13
    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 256
    n_layers: int = 3
    max_len: int = 32
    activation: str = "gelu"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        _check_sizes(self, ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"))


# --------------------------------------------------------------------- training runs


@dataclass(frozen=True)
class SequenceTrainConfig:
    task: str = "copy"  # or "reverse"
    steps: int = 800
    seed: int = 7
    lr: float = 1e-3
    batch_size: int = 32
    clip: float = 1.0
    eval_every: int = 100


@dataclass(frozen=True)
class CharTrainConfig:
    steps: int = 300
    seed: int = 7
    lr: float = 3e-3
    batch_size: int = 32
    context: int = 32
    clip: float = 1.0
    weight_decay: float = 0.01
    eval_every: int = 50
    prompt: str | None = None  # the sample's prompt; None: the text's first 3 characters


REFERENCE_RUNS = {  # what `numpy-engine train TASK` runs without flags
    "copy": SequenceTrainConfig(task="copy"),
    "reverse": SequenceTrainConfig(task="reverse", steps=1000),
    "char-lm": CharTrainConfig(),
}
