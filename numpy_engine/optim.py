"""Optimizers with PyTorch's exact update rules, and global-norm gradient clipping
(derived in docs/gradients.md#from-the-gradient-to-the-update-clipping-adam-adamw).

A model keeps all its parameters in one vector, model.flat, with model.params its named
views; an optimizer updates that vector block by block, each block while it is in cache
(on GPT-2's 124M parameters, a run of blocks on each of the engine's threads: threads.py):

    optimizer = AdamW(model.params, lr=3e-3)    # the params fix the state's layout and names
    loss, grads = model.loss_and_grads(*batch)
    optimizer.step(model.flat, grads, max_grad_norm=1.0)  # clips, then updates model.flat

The gradients are the dict loss_and_grads returns (keyed and ordered like the params), read
block by block without being concatenated whole, or one flat vector laid out like
model.flat (model.flat_grads(grads); clip_grad_norm scales such a vector in place, for a
loop that clips on its own). The step never changes the gradients it is given; with
error_if_nonfinite=True a NaN or inf among them is an error before anything is updated.
How the gradients are read block by block, their norm and the clipping are in clipping.py.

The state (step count, moments) is saved per parameter by `state_dict()` (copies) or
`state_arrays()` (views, for writing at once) and restored by `load_state_dict()`, keyed
"<moment>.<param key>".
"""

from __future__ import annotations

import math

import numpy as np

from numpy_engine.checks import (
    InputError,
    InputTypeError,
    check_clipping_norm,
    check_number_in,
    check_positive_finite,
)
from numpy_engine.clipping import (
    Gradients,
    NonFiniteGradients,
    arrays_spanned,
    blocks,
    clip_coefficient,
    clip_grad_norm,
    in_thread_runs,
    norm_of_blocks,
    thread_runs,
)
from numpy_engine.memory import aligned_empty, aligned_zeros
from numpy_engine.params import unflatten

__all__ = [  # clip_grad_norm and NonFiniteGradients are clipping.py's, known from here too
    "SGD",
    "Adam",
    "AdamW",
    "NonFiniteGradients",
    "Optimizer",
    "clip_grad_norm",
    "no_decay_keys",
]

GATHER_WHOLE_BLOCKS = 4  # a gradients dict of at most this many blocks is gathered whole


class Optimizer:
    """What SGD, Adam and AdamW share: the step counter, the flat state, its named views, and
    the step's walk over blocks of the vectors."""

    state_names: tuple[str, ...] = ()
    # True: the update takes the clipping coefficient in its constants and scales by it in
    # passes it makes anyway; False: the step scales each gradient block in a pass of its own
    folds_clipping = False

    def __init__(self, params: dict[str, np.ndarray], lr: float) -> None:
        check_positive_finite("lr", lr)
        self.lr = lr
        self.step_count = 0
        self.size = sum(p.size for p in params.values())
        self.dtype = next(iter(params.values())).dtype
        self.flat_state = {name: aligned_zeros(self.size, self.dtype) for name in self.state_names}
        self.state = {name: unflatten(flat, params) for name, flat in self.flat_state.items()}
        self.keys = list(params)
        self.shapes = [p.shape for p in params.values()]
        self.starts = np.cumsum([0] + [p.size for p in params.values()]).tolist()
        self.pieces = blocks(self.size, self.dtype.itemsize)
        self.block_entries = self.pieces[0].stop
        # the step's rows: two for the update's intermediates, one for a gathered or clipped
        # gradient; allocated once, on cache lines (a step of the copy model is ~1.6 ms), and
        # once more for each further thread the step runs on (threads.py)
        self.scratch = aligned_empty((3, self.block_entries), self.dtype)
        self.scratches = [self.scratch]
        # a grads dict of a few blocks is gathered once, whole (one block: into the scratch
        # row): block by block, the norm and then the update would each gather every block
        # that spans arrays (char-lm: 3 blocks)
        self.gathered = self.scratch[2] if len(self.pieces) == 1 else None
        if 1 < len(self.pieces) <= GATHER_WHOLE_BLOCKS:
            self.gathered = aligned_empty(self.size, self.dtype)

    def step(
        self,
        flat_params: np.ndarray,
        grads,
        max_grad_norm: float | None = None,
        error_if_nonfinite: bool = False,
    ):
        """Update flat_params in place from grads (the dict loss_and_grads returns, or a flat
        vector laid out like flat_params; neither is changed). With max_grad_norm (above 0; inf
        clips nothing), clip as clip_grad_norm does first and return the norm before clipping;
        else None. (An optimizer that folds_clipping scales by the coefficient inside its update
        instead: the same step to rounding.)

        error_if_nonfinite (torch's clip_grad_norm_ flag): a NaN or infinite norm, so some
        NaN or inf in grads, raises NonFiniteGradients before anything is updated. The norm
        finds them at no cost of its own when clipping: a training loop's guard."""
        self.check_vector("flat_params", flat_params)
        if max_grad_norm is not None:
            check_clipping_norm("max_grad_norm", max_grad_norm)
        gradients = Gradients(grads, self, self.gathered)
        scratches = self._scratches()
        norm = coef = None
        if max_grad_norm is not None or error_if_nonfinite:
            norm = norm_of_blocks(
                lambda piece, thread: gradients.block(piece, scratches[thread][2]), self.pieces
            )
            if error_if_nonfinite and not math.isfinite(norm):
                raise NonFiniteGradients(f"the gradients' norm is {norm}")
        if max_grad_norm is not None:
            coef = clip_coefficient(norm, max_grad_norm)
        self.step_count += 1
        constants = self._step_constants(coef if self.folds_clipping else None)
        scale = None if coef is None or self.folds_clipping else self.dtype.type(coef)
        state = list(self.flat_state.values())

        def update(thread: int, pieces: list[slice]) -> None:  # a run of blocks, on one thread
            scratch = scratches[thread]
            for piece in pieces:
                n = piece.stop - piece.start
                grad = gradients.block(piece, scratch[2])
                if scale is not None:  # clipping by a pass of its own, while the block is in cache
                    grad = np.multiply(grad, scale, out=scratch[2, :n])
                blocks_of_state = [flat[piece] for flat in state]
                self._update_block(
                    piece, flat_params[piece], grad, blocks_of_state, scratch[:2, :n], constants
                )

        in_thread_runs(update, self.pieces)
        return norm if max_grad_norm is not None else None

    def _scratches(self) -> list[np.ndarray]:
        """Three scratch rows for each thread the step runs on (see __init__): only the
        caller's where the blocks are too few to share (char-lm's 3 run on one thread)."""
        while len(self.scratches) < thread_runs(self.pieces):
            self.scratches.append(aligned_empty((3, self.block_entries), self.dtype))
        return self.scratches

    def check_vector(self, name: str, flat) -> None:
        if not isinstance(flat, np.ndarray) or flat.shape != (self.size,):
            got = getattr(flat, "shape", type(flat).__name__)
            raise InputError(f"{name} must be a vector of {self.size} entries, got {got}")
        if flat.dtype != self.dtype:
            raise InputTypeError(f"{name} must have dtype {self.dtype}, got {flat.dtype}")

    def check_grads_dict(self, grads: dict, dtypes: bool = True) -> None:
        """The keys in order, and each array's shape (and dtype: a slow compare, skipped when
        the caller's reading checks them) as the params'."""
        if list(grads) != self.keys:
            missing, extra = set(self.keys) - grads.keys(), grads.keys() - set(self.keys)
            raise InputError(
                "grads must have exactly the parameters' keys, in their order: "
                f"missing {sorted(missing)}, unexpected {sorted(extra)}"
            )
        try:
            same = [g.shape for g in grads.values()] == self.shapes
            same = same and (not dtypes or all(g.dtype == self.dtype for g in grads.values()))
        except AttributeError:  # not an array
            same = False
        if not same:
            for key, g, shape in zip(self.keys, grads.values(), self.shapes, strict=True):
                if not isinstance(g, np.ndarray):
                    raise InputError(f"grads[{key!r}] must be an array, got {type(g).__name__}")
                if g.shape != shape:
                    raise InputError(f"grads[{key!r}] must have shape {shape}, got {g.shape}")
                if g.dtype != self.dtype:
                    raise InputTypeError(
                        f"grads[{key!r}] must have dtype {self.dtype}, got {g.dtype}"
                    )

    def _step_constants(self, grad_scale: float | None) -> tuple:
        """What every block's update shares this step (after step_count was counted);
        grad_scale is the clipping coefficient when folds_clipping (None: no clipping)."""
        return ()

    def _update_block(self, piece: slice, param, grad, state: list, scratch, constants) -> None:
        """Update param, the block piece of the parameter vector, in place from grad; state
        holds the same block of each flat_state vector, scratch two rows of the block's length."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, np.ndarray]:
        """{"step": int array, "<state>.<param key>": array}, flat: copies of the state."""
        return {key: value.copy() for key, value in self.state_arrays().items()}

    def state_arrays(self) -> dict[str, np.ndarray]:
        """As state_dict, but the moments are views of the live state, not copies: to write
        to a checkpoint at once (on GPT-2 copies would be 1 GB more at every save)."""
        flat = {"step": np.array(self.step_count)}
        for name, per_param in self.state.items():
            flat.update({f"{name}.{key}": value for key, value in per_param.items()})
        return flat

    def load_state_dict(self, flat: dict[str, np.ndarray], consume: bool = False) -> None:
        """Copy a state_dict's arrays into the state. consume: pop each array from flat once
        copied, so that it goes (a resumed GPT-2's moments: 1 GB), after every key and
        shape was checked: a refused flat is left whole."""
        expected = self.state_arrays()
        missing, extra = expected.keys() - flat.keys(), flat.keys() - expected.keys()
        if missing or extra:
            raise InputError(
                f"optimizer state: missing keys {sorted(missing)}, unexpected keys {sorted(extra)}"
            )
        for key, value in expected.items():
            if flat[key].shape != value.shape:
                raise InputError(
                    f"optimizer state {key} has shape {flat[key].shape}, expected {value.shape}"
                )
        self.step_count = int(flat["step"])
        for key, value in expected.items():  # "step" too: into a fresh array, and popped
            value[...] = flat.pop(key) if consume else flat[key]  # into the flat state's view


class SGD(Optimizer):
    """p -= lr * d, d = g + wd p, with momentum buffer b = mu b + d (b = d on the first step)."""

    state_names = ("momentum_buffer",)

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, lr)
        check_number_in("momentum", momentum, 0)  # torch.optim.SGD's bounds
        check_number_in("weight_decay", weight_decay, 0)
        self.momentum, self.weight_decay = momentum, weight_decay

    def _update_block(self, piece, param, grad, state, scratch, constants) -> None:
        tmp, decayed = scratch
        d = grad
        if self.weight_decay:
            np.multiply(param, self.weight_decay, out=decayed)
            d = np.add(grad, decayed, out=decayed)
        if self.momentum:
            (buf,) = state
            if self.step_count == 1:
                buf[...] = d
            else:
                buf *= self.momentum
                buf += d
            d = buf
        param -= np.multiply(d, self.lr, out=tmp)


class Adam(Optimizer):
    """PyTorch's Adam: bias correction by step count, eps outside the square root.

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    (computed block by block, each block while it is in cache; see Optimizer.step)
    weight_decay here is L2 (added to g), as torch.optim.Adam; AdamW decouples it.

    no_decay: keys of parameters the decay leaves alone, as torch's optimizer with those in a
    param group of weight_decay 0 (e.g. no_decay_keys(params): biases and layernorms).
    """

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        no_decay=(),
    ):
        super().__init__(params, lr)
        check_betas(betas)
        check_number_in("eps", eps, 0)  # torch.optim.Adam's bounds, and finite
        check_number_in("weight_decay", weight_decay, 0)
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay
        unknown = set(no_decay) - set(self.keys)
        if unknown:
            raise InputError(f"no_decay names no parameter: {sorted(unknown)}")
        self.no_decay = frozenset(no_decay)
        self.decayed = self._decayed_parts()

    def _decayed_parts(self) -> dict[int, list[slice] | None]:
        """For each block (by its start), the slices of it that decay: None for the whole
        block, the usual case (one pass), else the parts of it that hold decayed parameters."""
        parts: dict[int, list[slice] | None] = {}
        for piece in self.pieces:
            decayed = [
                (self.starts[i] - piece.start, lo, hi)  # the array's offset in the block
                for i, lo, hi in arrays_spanned(piece, self.starts)
                if self.keys[i] not in self.no_decay
            ]
            inside = _joined([slice(offset + lo, offset + hi) for offset, lo, hi in decayed])
            parts[piece.start] = None if inside == [slice(0, piece.stop - piece.start)] else inside
        return parts

    def _l2_term(self, piece: slice, param, out) -> None:
        """weight_decay * param into out where the block's parameters decay, 0 elsewhere."""
        parts = self.decayed[piece.start]
        if parts is None:
            np.multiply(param, self.weight_decay, out=out)
            return
        out[...] = 0.0
        for part in parts:
            np.multiply(param[part], self.weight_decay, out=out[part])

    folds_clipping = True

    def _step_constants(self, grad_scale: float | None) -> tuple:
        """(step size, eps, the moments' factors, grad_scale): what every block shares.

        p -= lr / c1 * m / (sqrt(v) / c2 + eps), c1 = 1 - b1^t, c2 = sqrt(1 - b2^t), as
        p -= (lr c2 / c1) * m / (sqrt(v) + eps c2): the same value, one pass fewer. The
        clipping coefficient c joins the moments' factors: with g the block's gradient and
        c g the clipped one, m takes (1 - b1) c g, and v takes that times (1 - b2) c g /
        (1 - b1): no pass of its own scales g (see _update_block). With L2 weight decay the
        update forms c g + wd p first, and the factors hold no c."""
        beta1, beta2 = self.betas
        c2 = math.sqrt(1 - beta2**self.step_count)
        c = 1.0 if grad_scale is None or self.weight_decay else grad_scale
        m_factor, v_factor = (1 - beta1) * c, (1 - beta2) * c / (1 - beta1)
        step_size = self.lr * c2 / (1 - beta1**self.step_count)
        return (step_size, self.eps * c2, m_factor, v_factor, grad_scale)

    def _update_block(self, piece, param, grad, state, scratch, constants) -> None:
        """The update on one block, in place; constants from _step_constants.

        torch's order but for the moments, taken as b1 m + (1 - b1) g (torch's lerp,
        m + (1 - b1)(g - m), is the same to rounding) so that clipping folds into the
        factor that multiplies g anyway: 12 passes a block, as without clipping."""
        beta1, beta2 = self.betas
        step_size, eps, m_factor, v_factor, grad_scale = constants
        m, v = state
        tmp, work = scratch
        if self.weight_decay:  # L2: c g + weight_decay * param, formed once (both moments read it)
            self._l2_term(piece, param, work)
            if grad_scale is not None:  # clipped: c g first (the factors hold no c here)
                work += np.multiply(grad, grad_scale, out=tmp)
            else:
                work += grad
            grad = work
        np.multiply(grad, m_factor, out=tmp)  # (1 - b1) c g
        m *= beta1
        m += tmp  # m = b1 m + (1 - b1) c g
        np.multiply(grad, v_factor, out=work)  # (1 - b2) c g / (1 - b1); grad may be work
        work *= tmp
        v *= beta2
        v += work  # v = b2 v + (1 - b2) (c g)^2
        np.sqrt(v, out=tmp)
        tmp += eps  # Python floats keep float32 float32
        np.divide(m, tmp, out=tmp)
        tmp *= step_size
        param -= tmp


class AdamW(Adam):
    """Adam with decoupled weight decay: p *= 1 - lr * wd before the Adam step.

    no_decay: as Adam's, for the decoupled decay."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        no_decay=(),
    ):
        super().__init__(params, lr, betas, eps, weight_decay=0.0, no_decay=no_decay)
        check_number_in("weight_decay", weight_decay, 0)
        self.decoupled_weight_decay = weight_decay

    def _update_block(self, piece, param, grad, state, scratch, constants) -> None:
        if self.decoupled_weight_decay:  # p * 1.0 would be a pass that changes nothing
            factor = 1 - self.lr * self.decoupled_weight_decay
            parts = self.decayed[piece.start]
            if parts is None:
                param *= factor
            else:
                for part in parts:
                    param[part] *= factor
        super()._update_block(piece, param, grad, state, scratch, constants)


def check_betas(betas: object) -> None:
    """A pair (beta1, beta2), each in [0, 1) as torch.optim.Adam asks: at 1 a moment would
    never move, and the bias correction 1 - beta^t would divide by 0."""
    if not isinstance(betas, tuple | list) or len(betas) != 2:
        raise InputError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    for i, beta in enumerate(betas):
        check_number_in(f"betas[{i}]", beta, 0, 1)


def _joined(parts: list[slice]) -> list[slice]:
    """Consecutive slices in order, with those that meet made one (one pass instead of two)."""
    joined: list[slice] = []
    for part in parts:
        if joined and joined[-1].stop == part.start:
            joined[-1] = slice(joined[-1].start, part.stop)
        else:
            joined.append(part)
    return joined


def no_decay_keys(params: dict[str, np.ndarray]) -> list[str]:
    """The parameters that are not matrices: biases and layernorms' scales and shifts. Weight
    decay leaves them alone in Hugging Face's Trainer (biases and LayerNorm weights by name)
    and nanoGPT (every parameter of fewer than 2 dimensions); the weight matrices and the
    embedding tables decay."""
    return [key for key, p in params.items() if p.ndim < 2]
