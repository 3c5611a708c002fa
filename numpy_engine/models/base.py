"""The model contract, and the registry of model kinds.

A model kind is one module (seq2seq.py, minigpt.py): a frozen config class carrying the
special token ids, and a Model subclass decorated with @register. The class says
everything the rest of the engine needs to know; checkpoints, the command line, the
benchmark and the PyTorch converter look the kind up here by its name, or ask the model.

Shape legend: B batch, T positions, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Protocol

import numpy as np

from numpy_engine import checks
from numpy_engine.activations import ACTIVATIONS
from numpy_engine.checks import InputError, check_non_negative_int
from numpy_engine.dropout import drops, step_dropout
from numpy_engine.keys import sub
from numpy_engine.layernorm import layernorm_forward
from numpy_engine.layers import linear_forward
from numpy_engine.losses import cross_entropy_backward, cross_entropy_forward
from numpy_engine.memory import aligned_empty
from numpy_engine.params import check_param, check_param_keys, check_params, flatten, unflatten

DTYPES = ("float32", "float64")
IGNORE_INDEX = -100  # PyTorch's default ignore_index: a target that counts for nothing
# How many times over a step holds one block's weights at once, at most (Model.step_values):
# a projection's stacked weights, a layernorm folded into them, and their gradients before
# they are split. Measured with tracemalloc, beyond the weights each layer keeps: about 1.5
# blocks at d_model 256 (one layer), less at 768 (GPT-2) and 1024; 4 leaves room.
WEIGHT_COPIES = 4


def check_sizes(config: object, names: tuple[str, ...]) -> None:
    """What every transformer config checks: positive sizes, heads dividing d_model, known
    activation and dtype."""
    for name in names:
        checks.check_positive_int(name, getattr(config, name))
    if config.d_model % config.n_heads != 0:
        raise InputError(f"d_model={config.d_model} must be divisible by n_heads={config.n_heads}")
    checks.check_choice("activation", config.activation, tuple(ACTIVATIONS))
    checks.check_choice("dtype", config.dtype, DTYPES)


class Decoder(Protocol):
    """Incremental decoding state: the logits for the next token, and feeding the chosen ids."""

    def next_logits(self) -> np.ndarray: ...  # (B, V)

    def append(self, next_ids: np.ndarray) -> None: ...  # (B,)


class _NoDraws:
    """Stands in for the random generator of a model whose weights are written afterwards
    (Model.unwritten): each draw is zeros of its shape, which the system provides page by
    page only as they are written. The kinds' initialisers draw with these three."""

    def normal(self, loc=0.0, scale=1.0, size=None) -> np.ndarray:
        return np.zeros(size)

    def uniform(self, low=0.0, high=1.0, size=None) -> np.ndarray:
        return np.zeros(size)

    def standard_normal(self, size=None) -> np.ndarray:
        return np.zeros(size)


class Model:
    """What every model kind provides. Subclasses set the class attributes and implement the
    methods that raise NotImplementedError; the rest is shared."""

    kind: str  # the registered name, saved in checkpoints
    config_class: type  # a frozen dataclass with vocab_size and dtype
    torch_twin: str | None  # the torch_reference.models class with the same state_dict
    continues_prompt: bool  # True: generate() continues ids; False: greedy_decode() a source

    def __init__(self, config, seed: int = 0) -> None:
        check_non_negative_int("seed", seed)
        self._build(config, np.random.default_rng(seed))

    @classmethod
    def with_params(cls, config, params: dict[str, np.ndarray]):
        """A model of config holding params (checked as load_params checks them)."""
        model = cls.unwritten(config)
        model.load_params(params)
        return model

    @classmethod
    def unwritten(cls, config):
        """A model of config whose weights are not written yet (load_params or read_params
        writes them). It draws no initial weights (GPT-2's draws took 3-5 s and 1 GB of
        float64), and its vector holds no memory until written: the system maps its pages in
        as they are."""
        model = cls.__new__(cls)
        model._hold(config, model._init_params(config, _NoDraws()))  # zeros: their shapes
        return model

    def _build(self, config, rng) -> None:
        initial = self._init_params(config, rng)
        self._hold(config, initial)
        flatten(initial, self.flat)

    def _hold(self, config, like: dict[str, np.ndarray]) -> None:
        """A vector for parameters shaped like `like`'s arrays, and its views, unwritten."""
        self.config = config
        size = sum(value.size for value in like.values())
        # every parameter, one vector on a cache line (the optimizer walks it in blocks)
        self.flat = aligned_empty(size, config.dtype)
        self.params = unflatten(self.flat, like)  # named views of it, keyed like state_dict

    # ------------------------------------------------------------ what a kind implements

    @staticmethod
    def _init_params(config, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """The initial weights, keyed like state_dict, drawn with rng's normal, uniform or
        standard_normal (a model made from given weights passes _NoDraws instead)."""
        raise NotImplementedError

    def forward(self, *inputs: np.ndarray) -> tuple:
        """(logits (B, T, V), cache for backward: a NamedTuple with a logits_shape field)."""
        raise NotImplementedError

    def _backward(self, dlogits: np.ndarray, cache) -> dict[str, np.ndarray]:
        """Gradients keyed (and ordered) like self.params."""
        raise NotImplementedError

    def _targets(self, targets: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """The checked targets (B, T); ignore_index() marks the ones that do not count."""
        raise NotImplementedError

    def ignore_index(self) -> int:
        """The target id that counts for nothing in the loss (padding)."""
        raise NotImplementedError

    # loss_and_grads(*inputs, targets) and loss(*inputs, targets), with the forward's input
    # names: each kind spells them out and calls _loss_and_grads / _loss. A kind whose config
    # has dropout rates (dropout.SITES' *_dropout fields) also takes dropout_rng in both and
    # dropout= in its forward (a training step's dropout.Dropout), and drops only then.

    def decoder(self, inputs: np.ndarray, use_cache: bool = True) -> Decoder:
        """Step-by-step decoding from a source (B, S) or a prompt (B, T0)."""
        raise NotImplementedError

    def attention_panels(self, ids: np.ndarray, labels: list[str]) -> list[tuple]:
        """(title, weights (H, Tq, Tk), key labels, query labels) per attention layer, for one
        example's ids (T,): what `numpy-engine attention` draws."""
        raise NotImplementedError

    @staticmethod
    def example_batch(
        config, rng: np.random.Generator, batch_size: int, length: int | None = None
    ) -> tuple:
        """A padded batch for loss_and_grads, with `length` positions (a seq2seq model's
        source length; None: the kind's default): the `grads` and `parity` commands, the
        benchmark and tests use it."""
        raise NotImplementedError

    @staticmethod
    def forward_flops(config, batch_size: int, length: int) -> float:
        """Matmul FLOPs of one forward over example_batch(config, _, batch_size, length)."""
        raise NotImplementedError

    @staticmethod
    def step_values(config, batch_size: int, length: int) -> int:
        """A generous count of the values one training step holds beyond the parameters and
        their gradients: activations and their gradients, attention scores, logits, the
        stacked projection weights each layer keeps for its backward, and a block's weights
        held again at once (WEIGHT_COPIES). step_memory.check_step_fits adds the gradients and the
        optimizer's moments and checks the sum against free memory before training starts."""
        raise NotImplementedError

    # ------------------------------------------------------------------ shared by all

    def backward(self, dlogits: np.ndarray, cache) -> dict[str, np.ndarray]:
        """Gradients of every parameter, keyed like self.params. See docs/gradients.md#models."""
        dlogits = checks.check_upstream_gradient(
            "dlogits", dlogits, cache.logits_shape, self.flat.dtype
        )
        return self._backward(dlogits, cache)

    def _loss_and_grads(
        self, inputs: tuple, targets: np.ndarray, dropout_rng=None
    ) -> tuple[float, dict]:
        """Mean cross-entropy over the targets that count, and its gradient for every
        parameter. dropout_rng: a training step's generator of dropout masks, for a kind
        whose forward takes dropout= (None: nothing dropped)."""
        logits, cache = self.forward(*inputs, **self._dropping(dropout_rng))
        targets = self._targets(targets, logits)
        loss, ce_cache = cross_entropy_forward(logits, targets, self.ignore_index())
        dlogits = cross_entropy_backward(1.0, ce_cache)
        return float(loss), self._backward(dlogits, cache)  # a NaN loss flows on, for the caller

    def _loss(self, inputs: tuple, targets: np.ndarray, dropout_rng=None) -> float:
        logits, _ = self.forward(*inputs, **self._dropping(dropout_rng))
        targets = self._targets(targets, logits)
        return float(cross_entropy_forward(logits, targets, self.ignore_index())[0])

    def _dropping(self, dropout_rng) -> dict:
        """forward's keyword for a training step's dropout from dropout_rng, or none."""
        dropout = step_dropout(self.config, dropout_rng)
        return {} if dropout is None else {"dropout": dropout}

    def uses_dropout(self) -> bool:
        """True when training steps drop (the config has a dropout rate above 0, in fields
        named as dropout.SITES say): the loop then gives loss_and_grads a dropout_rng."""
        return drops(self.config)

    def count_targets(self, targets: np.ndarray) -> int:
        """How many of a batch's targets count in its loss: the mean's denominator."""
        return int((np.asarray(targets) != self.ignore_index()).sum())

    def flat_grads(self, grads: dict[str, np.ndarray], out: np.ndarray | None = None):
        """grads as one vector laid out like self.flat: a new array, or written into out
        (shaped like self.flat). The optimizer and the data-parallel sum read the grads dict
        itself; this vector is for clip_grad_norm, in a loop that clips on its own."""
        if list(grads) != list(self.params):
            raise InputError("grads must have exactly the model's parameter keys, in order")
        return flatten(grads, out)

    def load_params(self, params: dict[str, np.ndarray]) -> None:
        """Copy params (which must match keys, shapes and dtypes, all checked first) into
        this model's weights."""
        check_params(params, self.params)
        for key, value in self.params.items():
            value[...] = params[key]  # a copy, into self.flat

    def read_params(self, keys, read: Callable[[str], np.ndarray]) -> None:
        """Write an unwritten model's weights (Model.unwritten), read one at a time by
        read(key) and checked as load_params checks them: each is let go of before the next
        is read, so the peak is the model and one weight, not the model and all its weights
        read (`numpy-engine generate` from a 124M GPT-2: peak RSS 1281 -> 615 MB). keys: the
        keys read would find, checked against the model's first. A refused weight leaves
        the model part written."""
        check_param_keys(keys, self.params)
        for key, view in self.params.items():
            _write(key, read(key), view)  # the weight read lives in the call, no longer

    def with_dtype(self, dtype: str):
        """A copy of this model with its config and weights cast to dtype ("float32"/"float64")."""
        checks.check_choice("dtype", dtype, DTYPES)
        params = {key: value.astype(dtype) for key, value in self.params.items()}
        return type(self).with_params(dataclasses.replace(self.config, dtype=dtype), params)

    def num_parameters(self) -> int:
        return self.flat.size

    def _under(self, prefix: str) -> dict[str, np.ndarray]:
        """The params under prefix, without it (keys.sub, which looks the keys up once)."""
        return sub(self.params, prefix)


def _write(key: str, value: np.ndarray, view: np.ndarray) -> None:
    check_param(key, value, view)
    view[...] = value  # into the model's flat vector


# ------------------------------------------------------------------------- registry

KINDS: dict[str, type[Model]] = {}


def register(model_class: type[Model]) -> type[Model]:
    """Class decorator: make model_class the kind named model_class.kind."""
    if model_class.kind in KINDS and KINDS[model_class.kind] is not model_class:
        raise ValueError(f"model kind {model_class.kind!r} is already registered")
    KINDS[model_class.kind] = model_class
    return model_class


def model_class(kind: str) -> type[Model]:
    """The registered model class of that kind, or an InputError naming the known kinds."""
    if kind not in KINDS:
        raise InputError(f"unknown model kind {kind!r}; known: {', '.join(KINDS)}")
    return KINDS[kind]


# ------------------------------------------------------------------ decoding helpers


def readout_last(x: np.ndarray, norm: tuple, head: tuple) -> np.ndarray:
    """The final layernorm (weight, bias) and the output projection (weight, bias or None), on
    the last position: logits (B, V)."""
    x, _ = layernorm_forward(x[:, -1:], *norm)
    logits, _ = linear_forward(x, *head)
    return logits[:, 0]


class RerunDecoder:
    """The simple path for a model that continues a prompt: every step reruns the model on the
    last config.max_len ids."""

    def __init__(self, model: Model, prompt: np.ndarray) -> None:
        self.model, self.ids = model, prompt  # (B, T0)

    def next_logits(self) -> np.ndarray:
        logits, _ = self.model.forward(self.ids[:, -self.model.config.max_len :])
        return logits[:, -1]  # (B, V)

    def append(self, next_ids: np.ndarray) -> None:
        self.ids = np.concatenate([self.ids, next_ids[:, None]], axis=1)
