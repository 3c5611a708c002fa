"""MiniGPT, the decoder-only character model: config, model, and its KV-cached decoder.

Shape legend: B batch, T positions, C = d_model, V vocabulary, L tokens decoded so far.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from numpy_engine import checks
from numpy_engine.blocks import (
    normed,
    normed_backward,
    self_attention_block_backward,
    self_attention_block_forward,
)
from numpy_engine.checks import InputError
from numpy_engine.dropout import check_rates, dropped, drops, site_mask, step_dropout
from numpy_engine.keys import sub, with_prefix
from numpy_engine.kvcache import KeyValueBuffer
from numpy_engine.layers import (
    embedding_backward,
    embedding_forward,
    learned_positions_backward,
    learned_positions_forward,
    linear_backward,
    linear_forward,
)
from numpy_engine.losses import linear_cross_entropy, linear_cross_entropy_loss
from numpy_engine.masks import causal_visible
from numpy_engine.models.base import (
    IGNORE_INDEX,
    WEIGHT_COPIES,
    Model,
    RerunDecoder,
    check_sizes,
    readout_last,
    register,
)
from numpy_engine.multihead import (
    keys_values,
    prestacked_qkv,
)
from numpy_engine.params import layernorm_params, linear_params, self_block_params


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
    eos_id: int | None = None  # the end-of-text token: generation stops there; None: no stop
    # dropout rates of training steps (dropout.py): after the embeddings, on the attention
    # weights, and on each sublayer's output (Hugging Face's embd_, attn_ and resid_pdrop)
    embed_dropout: float = 0.0
    attn_dropout: float = 0.0
    resid_dropout: float = 0.0

    def __post_init__(self) -> None:
        check_sizes(self, ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"))
        check_rates(self)
        if self.eos_id is not None and not 0 <= self.eos_id < self.vocab_size:
            raise InputError(f"eos_id={self.eos_id} must be in [0, vocab_size={self.vocab_size})")


def normal_init(rng: np.random.Generator):
    """init(shape) -> N(0, 0.02) draws from rng: GPT-2's weights and embeddings."""
    return lambda shape: rng.normal(0.0, 0.02, shape)


def trunk_params(cfg: GPTConfig, rng: np.random.Generator) -> dict:
    """Everything but the head: embeddings N(0, 0.02), blocks' weight matrices N(0, 0.02),
    zero biases, unit layernorms, in the order the forward uses them."""
    init = normal_init(rng)
    C, F = cfg.d_model, cfg.d_ff
    params = {
        "tok_embed.weight": init((cfg.vocab_size, C)),
        "pos_embed.weight": init((cfg.max_len, C)),
    }
    for i in range(cfg.n_layers):
        params.update(with_prefix(self_block_params(init, C, F), f"blocks.{i}."))
    return params | with_prefix(layernorm_params(C), "final_norm.")


class GPTCache(NamedTuple):
    tok_embed: tuple
    pos_embed: tuple
    blocks: list
    final_norm: tuple
    head_affine: tuple | None  # final_norm's scale and shift, when folded into the head
    head: tuple
    logits_shape: tuple
    embed_drop: np.ndarray | None = None  # the embeddings' dropout mask (B, T, C)


@register
class MiniGPT(Model):
    """Decoder-only character model: token + learned position embeddings, causal blocks."""

    kind = "gpt"
    config_class = GPTConfig
    torch_twin = "MiniGPT"
    continues_prompt = True

    @staticmethod
    def _init_params(cfg: GPTConfig, rng: np.random.Generator) -> dict:
        """N(0, 0.02) for embeddings and weight matrices, as GPT-2; zero biases."""
        params = trunk_params(cfg, rng)  # drawn first: the head's draws come after
        head = linear_params(normal_init(rng), cfg.vocab_size, cfg.d_model)
        return params | with_prefix(head, "head.")

    def forward(self, idx: np.ndarray) -> tuple:
        """Logits (B, T, V) for idx (B, T) int ids, T <= max_len."""
        x, cache = self._trunk_forward(idx)  # (B, T, C)
        logits, head = linear_forward(x, *self._head(), cache.head_affine)  # (B, T, V)
        return logits, cache._replace(head=head, logits_shape=logits.shape)

    def _trunk_forward(self, idx: np.ndarray, keep_blocks: bool = True, dropout=None) -> tuple:
        """Everything before the head: (final_norm's output (B, T, C), its GPTCache, whose
        head fields are still None). The output is without final_norm's scale and shift when
        the cache's head_affine holds them, for the head to fold in (blocks.normed).
        keep_blocks=False (evaluation): the cache keeps no block's, so each block's
        activations are freed before the next runs; the output is the same. dropout: a
        training step's (dropout.py), whose masks the cache keeps; None drops nothing."""
        cfg, p = self.config, self.params
        idx = checks.check_token_ids("idx", idx, cfg.vocab_size)
        if idx.shape[1] > cfg.max_len:
            raise InputError(f"idx has {idx.shape[1]} positions but max_len is {cfg.max_len}")
        visible = causal_visible(idx.shape[1])  # (1, 1, T, T)

        x, tok_embed = embedding_forward(idx, p["tok_embed.weight"])  # (B, T, C)
        x, pos_embed = learned_positions_forward(x, p["pos_embed.weight"])
        embed_drop = site_mask(dropout, "embed", x.shape, x.dtype)
        x = dropped(x, embed_drop)  # x is the positions' fresh sum
        blocks = []
        for i in range(cfg.n_layers):
            block_p = self._under(f"blocks.{i}.")
            x, block = self_attention_block_forward(
                x, block_p, cfg.n_heads, visible, cfg.activation, dropout=dropout
            )
            if keep_blocks:
                blocks.append(block)
            del block  # else its activations go now, not once the next block has run
        x, final_norm, head_affine = normed(x, p, "final_norm", cfg.vocab_size)
        norm = (final_norm, head_affine)
        return x, GPTCache(tok_embed, pos_embed, blocks, *norm, None, None, embed_drop)

    def _backward(self, dlogits: np.ndarray, cache: GPTCache) -> dict[str, np.ndarray]:
        dx, head_grads = linear_backward(dlogits, cache.head)
        return self._trunk_backward(dx, cache, head_grads)

    def _trunk_backward(self, dx: np.ndarray, cache: GPTCache, head_grads: dict) -> dict:
        """From the head's input gradient dx (B, T, C) down to the embeddings: every
        parameter's gradient, keyed and ordered like params."""
        dx, norm_grads = normed_backward(dx, cache.final_norm, head_grads)  # x = final_norm(x)
        grads = with_prefix(norm_grads, "final_norm.")
        for i in reversed(range(len(cache.blocks))):  # forward was x = block_i(x), i = 0, 1, ...
            dx, block_grads = self_attention_block_backward(dx, cache.blocks[i])
            grads |= with_prefix(block_grads, f"blocks.{i}.")
        dx = dropped(dx, cache.embed_drop)  # forward was x = drop(tok + pos); dx is fresh
        dx, pos_grads = learned_positions_backward(dx, cache.pos_embed)  # x = tok + pos_embed[t]
        grads |= with_prefix(pos_grads, "pos_embed.")
        # forward was tok = tok_embed[idx]; the head's own term joins it if the two are tied
        grads |= self._head_and_embedding_grads(head_grads, dx, cache.tok_embed)
        return {key: grads[key] for key in self.params}

    def _loss_and_grads(
        self, inputs: tuple, targets: np.ndarray, dropout_rng=None
    ) -> tuple[float, dict]:
        """As Model's, with the head and the loss fused (losses.linear_cross_entropy): the
        (B, T, V) logits exist once, and become their own gradient. dropout_rng: a training
        step's generator of dropout masks (None: nothing dropped)."""
        x, cache = self._trunk_forward(*inputs, dropout=step_dropout(self.config, dropout_rng))
        targets = self._targets(targets, x)
        head, ignore = self._head(), self.ignore_index()
        loss, dx, head_grads = linear_cross_entropy(x, *head, targets, ignore, cache.head_affine)
        return loss, self._trunk_backward(dx, cache, head_grads)

    def _loss(self, inputs: tuple, targets: np.ndarray, dropout_rng=None) -> float:
        """_loss_and_grads' loss (the same bits) without the gradients: evaluation too holds
        one (B, T, V) array at a time, not Model._loss's four, and one block's activations."""
        dropout = step_dropout(self.config, dropout_rng)
        x, cache = self._trunk_forward(*inputs, keep_blocks=False, dropout=dropout)
        targets = self._targets(targets, x)
        head, ignore = self._head(), self.ignore_index()
        return linear_cross_entropy_loss(x, *head, targets, ignore, cache.head_affine)

    def _head(self) -> tuple:
        """The output projection's (weight, bias): logits = final_norm(x) @ weight.T + bias."""
        return self.params["head.weight"], self.params["head.bias"]

    def _head_and_embedding_grads(self, head_grads: dict, dx: np.ndarray, tok_cache) -> dict:
        """The head's gradients, and the token embedding's from its output gradient dx."""
        _, tok_grads = embedding_backward(dx, tok_cache)
        return with_prefix(head_grads, "head.") | with_prefix(tok_grads, "tok_embed.")

    def loss_and_grads(
        self, idx: np.ndarray, targets: np.ndarray, dropout_rng=None
    ) -> tuple[float, dict[str, np.ndarray]]:
        """Mean next-token cross-entropy (targets of -100 are ignored) and its gradients;
        with dropout_rng (a training step's), the config's dropout applies, masks from it."""
        return self._loss_and_grads((idx,), targets, dropout_rng)

    def loss(self, idx: np.ndarray, targets: np.ndarray, dropout_rng=None) -> float:
        """The loss alone (evaluation); with dropout_rng, a training step's under its masks:
        what loss_and_grads given the same generator state differentiates."""
        return self._loss((idx,), targets, dropout_rng)

    def ignore_index(self) -> int:
        return IGNORE_INDEX

    def _targets(self, targets: np.ndarray, outputs: np.ndarray) -> np.ndarray:
        vocab = self.config.vocab_size
        return checks.check_targets(
            "targets", targets, outputs.shape[:2], vocab, IGNORE_INDEX, like="idx"
        )

    # ------------------------------------------------------------- decoding, study

    def decoder(self, prompt: np.ndarray, use_cache: bool = True):
        return (CachedGPTDecoder if use_cache else RerunDecoder)(self, prompt)

    def attention_panels(self, ids: np.ndarray, labels: list[str]) -> list[tuple]:
        """Each layer's causal self-attention over the last max_len ids."""
        _, cache = self.forward(np.asarray(ids)[None, -self.config.max_len :])
        labels = labels[-self.config.max_len :]
        return [
            (f"layer {i}", block.attn.attention.weights[0], labels, labels)
            for i, block in enumerate(cache.blocks)
        ]

    @staticmethod
    def example_batch(cfg: GPTConfig, rng, batch_size: int, length: int | None = None):
        """Random ids (B, T) and their next-token targets (default T: max_len); the last row's
        second half is ignored, as a padded row's would be."""
        length = cfg.max_len if length is None else length
        idx = rng.integers(0, cfg.vocab_size, size=(batch_size, length))
        targets = np.roll(idx, -1, axis=1)
        targets[:, -1] = IGNORE_INDEX  # no next token
        if batch_size > 1:
            targets[-1, length // 2 :] = IGNORE_INDEX
        return idx, targets

    @staticmethod
    def forward_flops(cfg: GPTConfig, batch_size: int, length: int) -> float:
        C, F, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
        N, T = batch_size * length, length
        per_block = 2 * N * (4 * C * C + 2 * C * F) + 2 * 2 * N * T * C  # proj, FFN, attention
        return cfg.n_layers * per_block + 2 * N * C * V

    @staticmethod
    def step_values(cfg: GPTConfig, batch_size: int, length: int) -> int:
        """As Seq2SeqTransformer.step_values, for n_layers causal blocks, each keeping its
        stacked q, k, v weights (3 C^2), but 2 per logit: the fused head and loss turn the
        logits into their gradient in place (losses.linear_cross_entropy; measured 1.06).
        With dropout, each layer keeps its masks too (the weights' and two outputs'), and
        one dropped copy of weights and of an output lives at a time."""
        C, F = cfg.d_model, cfg.d_ff
        tokens = batch_size * length
        cells = tokens * cfg.n_heads * length
        per_layer = tokens * (16 * C + 4 * F) + 3 * cells + 3 * C * C
        block = 4 * C * C + 2 * C * F
        values = cfg.n_layers * per_layer + 2 * tokens * cfg.vocab_size + WEIGHT_COPIES * block
        if drops(cfg):
            values += (cfg.n_layers + 1) * (cells + 2 * tokens * C) + tokens * C
        return values


class CachedGPTDecoder:
    """Keeps each block's keys and values; a step runs one position through the model.

    Learned positions are absolute, so once the ids outgrow max_len the window slides,
    every position shifts, and the cache is rebuilt from the new window. Each block's q, k,
    v weights are stacked when the decoder is made: make a new one after changing weights.
    """

    def __init__(self, model: MiniGPT, prompt: np.ndarray) -> None:
        self.model, self.ids = model, prompt
        plain = [model._under(f"blocks.{i}.") for i in range(model.config.n_layers)]
        # each block's params, plus its q, k, v stacked once for the whole decoding
        self.blocks = [p | with_prefix(prestacked_qkv(sub(p, "attn.")), "attn.") for p in plain]
        self._prefill(prompt[:, -model.config.max_len :])

    def next_logits(self) -> np.ndarray:
        return self._logits

    def append(self, next_ids: np.ndarray) -> None:
        self.ids = np.concatenate([self.ids, next_ids[:, None]], axis=1)
        if self.length == self.model.config.max_len:  # the window slides: positions shift
            self._prefill(self.ids[:, -self.model.config.max_len :])
        else:
            self._logits = self._run(next_ids[:, None])

    def _prefill(self, window: np.ndarray) -> None:
        self.kv = [None] * self.model.config.n_layers  # per block: keys and values so far
        self.length = 0
        self._logits = self._run(window)

    def _run(self, new_ids: np.ndarray) -> np.ndarray:
        """Feed new_ids (B, n) at positions length .. length + n - 1; logits of the last.
        Several ids only at length 0 (_prefill), one a decoding step (append)."""
        cfg, p = self.model.config, self.model.params
        start, n = self.length, new_ids.shape[1]
        x = p["tok_embed.weight"][new_ids] + p["pos_embed.weight"][start : start + n]  # (B, n, C)
        # several ids come only in a window's first run (start 0): query i sees keys 0..i,
        # by causal_visible's own mask, whose long runs go by blocks of queries (attention.py);
        # one new query (a decoding step) sees every key so far: no mask
        visible = causal_visible(n) if n > 1 else None
        for i, past in enumerate(self.kv):
            x, block = self_attention_block_forward(
                x, self.blocks[i], cfg.n_heads, visible, cfg.activation, past, for_backward=False
            )
            if past is None:  # a window's first run: later steps write into this buffer
                self.kv[i] = KeyValueBuffer(keys_values(block.attn), cfg.max_len)
        self.length = start + n
        return readout_last(x, (p["final_norm.weight"], p["final_norm.bias"]), self.model._head())
