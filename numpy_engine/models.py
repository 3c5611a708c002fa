"""The two models: Seq2SeqTransformer (copy/reverse) and MiniGPT (character LM).

Each is a frozen config, a params dict keyed exactly like torch_reference's
state_dict (linear weights stored (out, in)), a forward that is one line per
layer and a backward that is the same list in reverse.

Shape legend: B batch, S source positions, T target (or only) positions,
C = d_model, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from numpy_engine import checks
from numpy_engine.attention import causal_visible, padding_visible
from numpy_engine.blocks import (
    decoder_block_backward,
    decoder_block_forward,
    self_attention_block_backward,
    self_attention_block_forward,
    with_prefix,
)
from numpy_engine.checks import InputError
from numpy_engine.configs import DTYPES, GPTConfig, Seq2SeqConfig
from numpy_engine.layers import (
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    embedding_forward,
    layernorm_backward,
    layernorm_forward,
    learned_positions_backward,
    learned_positions_forward,
    linear_backward,
    linear_forward,
    sinusoidal_backward,
    sinusoidal_forward,
)
from numpy_engine.params import (
    check_params,
    decoder_block_params,
    in_one_buffer,
    layernorm_params,
    linear_params,
    self_block_params,
)

GPT_IGNORE_INDEX = -100  # PyTorch's default ignore_index


class _Model:
    """What both models share: params, grads with the same keys, loading and the loss."""

    kind: str  # the model kind's name, a key of checkpoint.KINDS
    config: Seq2SeqConfig | GPTConfig
    params: dict[str, np.ndarray]

    def __init__(self, config: Seq2SeqConfig | GPTConfig, seed: int = 0) -> None:
        self.config = config
        self.params = self._init_params(config, np.random.default_rng(seed))
        self._keys_under: dict[str, list[str]] = {}  # see _under

    def load_params(self, params: dict[str, np.ndarray]) -> None:
        """Copy params (which must match keys, shapes and dtypes) into this model's weights."""
        for key, value in check_params(params, self.params).items():
            self.params[key][...] = value  # into the flat buffer's views

    def with_dtype(self, dtype: str):
        """A copy of this model with its config and weights cast to dtype ("float32"/"float64")."""
        checks.check_choice("dtype", dtype, DTYPES)
        twin = type(self)(dataclasses.replace(self.config, dtype=dtype))
        twin.load_params({key: value.astype(dtype) for key, value in self.params.items()})
        return twin

    def _under(self, prefix: str) -> dict[str, np.ndarray]:
        """sub(self.params, prefix), with the matching keys looked up once per prefix: a scan
        of every key per block and step costs small models ~2% of a step."""
        if prefix not in self._keys_under:
            self._keys_under[prefix] = [key for key in self.params if key.startswith(prefix)]
        return {key[len(prefix) :]: self.params[key] for key in self._keys_under[prefix]}

    def num_parameters(self) -> int:
        return sum(value.size for value in self.params.values())

    def _loss_and_grads(self, logits, cache, targets, ignore_index) -> tuple:
        loss, ce_cache = cross_entropy_forward(logits, targets, ignore_index)
        dlogits = cross_entropy_backward(1.0, ce_cache)
        return float(loss), self._backward(dlogits, cache)  # a NaN loss flows on, for the caller


# ------------------------------------------------------------------ seq2seq model


class EncoderCache(NamedTuple):
    src_embed: tuple
    blocks: list
    norm: tuple


class DecoderCache(NamedTuple):
    tgt_embed: tuple
    blocks: list
    norm: tuple
    readout: tuple


class Seq2SeqCache(NamedTuple):
    encoder: EncoderCache
    decoder: DecoderCache
    logits_shape: tuple


class Seq2SeqTransformer(_Model):
    """Encoder-decoder with one embedding table shared by source and target."""

    kind = "seq2seq"  # how checkpoints and the PyTorch twin name this model

    @staticmethod
    def _init_params(cfg: Seq2SeqConfig, rng: np.random.Generator) -> dict:
        """PyTorch's default init: N(0, 1) embeddings, U(+-1/sqrt(fan_in)) weights; zero biases."""

        def init(shape):
            bound = 1.0 / np.sqrt(shape[1])
            return rng.uniform(-bound, bound, shape)

        C, F = cfg.d_model, cfg.d_ff
        embed = rng.standard_normal((cfg.vocab_size, C))
        embed[cfg.pad_id] = 0.0  # Embedding(padding_idx) starts that row at zero
        params = {"embed.weight": embed}
        for i in range(cfg.n_encoder_layers):
            params.update(with_prefix(self_block_params(init, C, F), f"encoder.{i}."))
        params.update(with_prefix(layernorm_params(C), "encoder_norm."))
        for i in range(cfg.n_decoder_layers):
            params.update(with_prefix(decoder_block_params(init, C, F), f"decoder.{i}."))
        params.update(with_prefix(layernorm_params(C), "decoder_norm."))
        params.update(with_prefix(linear_params(init, cfg.vocab_size, C), "readout."))
        return in_one_buffer(params, cfg.dtype)

    def forward(self, source: np.ndarray, decoder_input: np.ndarray) -> tuple:
        """Logits (B, T, V) for source (B, S) and decoder_input (B, T), both int ids."""
        memory, encoder = self.encode(source)
        logits, decoder = self.decode(memory, source, decoder_input)
        return logits, Seq2SeqCache(encoder, decoder, logits.shape)

    def encode(self, source: np.ndarray) -> tuple:
        """The memory (B, S, C) that every decoder block's cross-attention reads."""
        cfg, p = self.config, self.params
        source = self.check_source(source)
        src_visible = padding_visible(source, cfg.pad_id)  # (B, 1, 1, S)
        x, src_embed = embedding_forward(source, p["embed.weight"], cfg.pad_id)  # (B, S, C)
        x, _ = sinusoidal_forward(x)
        blocks = []
        for i in range(cfg.n_encoder_layers):
            block_p = self._under(f"encoder.{i}.")
            x, block = self_attention_block_forward(
                x, block_p, cfg.n_heads, src_visible, cfg.activation
            )
            blocks.append(block)
        memory, norm = layernorm_forward(x, p["encoder_norm.weight"], p["encoder_norm.bias"])
        return memory, EncoderCache(src_embed, blocks, norm)

    def decode(self, memory: np.ndarray, source: np.ndarray, decoder_input: np.ndarray) -> tuple:
        """Logits (B, T, V) for decoder_input (B, T); cross-attention skips PAD in source."""
        cfg, p = self.config, self.params
        decoder_input = checks.check_token_ids("decoder_input", decoder_input, cfg.vocab_size)
        checks.check_same_batch("source", source, "decoder_input", decoder_input)
        src_visible = padding_visible(np.asarray(source), cfg.pad_id)  # (B, 1, 1, S)
        tgt_visible = causal_visible(decoder_input.shape[1]) & padding_visible(
            decoder_input, cfg.pad_id
        )  # (B, 1, T, T)
        y, tgt_embed = embedding_forward(decoder_input, p["embed.weight"], cfg.pad_id)  # (B, T, C)
        y, _ = sinusoidal_forward(y)
        blocks = []
        for i in range(cfg.n_decoder_layers):
            block_p = self._under(f"decoder.{i}.")
            y, block = decoder_block_forward(
                y, memory, block_p, cfg.n_heads, tgt_visible, src_visible, cfg.activation
            )
            blocks.append(block)
        y, norm = layernorm_forward(y, p["decoder_norm.weight"], p["decoder_norm.bias"])
        logits, readout = linear_forward(y, p["readout.weight"], p["readout.bias"])  # (B, T, V)
        return logits, DecoderCache(tgt_embed, blocks, norm, readout)

    def backward(self, dlogits: np.ndarray, cache: Seq2SeqCache) -> dict[str, np.ndarray]:
        """Gradients of every parameter, keyed like self.params. See docs/gradients.md#models."""
        dlogits = checks.check_upstream_gradient(
            "dlogits", dlogits, cache.logits_shape, self.params["readout.weight"].dtype
        )
        return self._backward(dlogits, cache)

    def _backward(self, dlogits: np.ndarray, cache: Seq2SeqCache) -> dict[str, np.ndarray]:
        grads: dict[str, np.ndarray] = {}
        dmemory, dembed_tgt = self._decode_backward(dlogits, cache.decoder, grads)
        dembed_src = self._encode_backward(dmemory, cache.encoder, grads)
        grads["embed.weight"] = dembed_src + dembed_tgt  # one table fed source and target
        return {key: grads[key] for key in self.params}

    def _decode_backward(self, dlogits, cache: DecoderCache, grads: dict) -> tuple:
        """Fills grads for the decoder's parameters; returns (dmemory, the target's dembed)."""
        dy, grads["readout.weight"], grads["readout.bias"] = linear_backward(dlogits, cache.readout)
        dy, grads["decoder_norm.weight"], grads["decoder_norm.bias"] = layernorm_backward(
            dy, cache.norm
        )
        dmemory = 0.0
        for i in reversed(range(len(cache.blocks))):
            dy, dmemory_i, block_grads = decoder_block_backward(dy, cache.blocks[i])
            dmemory = dmemory + dmemory_i  # memory fed every decoder block's cross-attention
            grads.update(with_prefix(block_grads, f"decoder.{i}."))
        return dmemory, embedding_backward(sinusoidal_backward(dy, None), cache.tgt_embed)

    def _encode_backward(self, dmemory, cache: EncoderCache, grads: dict) -> np.ndarray:
        """Fills grads for the encoder's parameters; returns the source's dembed."""
        dx, grads["encoder_norm.weight"], grads["encoder_norm.bias"] = layernorm_backward(
            dmemory, cache.norm
        )
        for i in reversed(range(len(cache.blocks))):
            dx, block_grads = self_attention_block_backward(dx, cache.blocks[i])
            grads.update(with_prefix(block_grads, f"encoder.{i}."))
        return embedding_backward(sinusoidal_backward(dx, None), cache.src_embed)

    def loss_and_grads(
        self, source: np.ndarray, decoder_input: np.ndarray, target: np.ndarray
    ) -> tuple[float, dict[str, np.ndarray]]:
        """Mean cross-entropy over non-padding targets, and its gradient for every parameter."""
        logits, cache = self.forward(source, decoder_input)
        target = self._check_target(target, logits.shape[:2])
        return self._loss_and_grads(logits, cache, target, self.config.pad_id)

    def loss(self, source: np.ndarray, decoder_input: np.ndarray, target: np.ndarray) -> float:
        logits, _ = self.forward(source, decoder_input)
        target = self._check_target(target, logits.shape[:2])
        return float(cross_entropy_forward(logits, target, self.config.pad_id)[0])

    def _check_target(self, target: np.ndarray, shape: tuple) -> np.ndarray:
        cfg = self.config
        return checks.check_targets(
            "target", target, shape, cfg.vocab_size, cfg.pad_id, like="decoder_input"
        )

    def check_source(self, source: np.ndarray) -> np.ndarray:
        source = checks.check_token_ids("source", source, self.config.vocab_size)
        all_padding = (source == self.config.pad_id).all(axis=1)
        if all_padding.any():
            b = int(np.argmax(all_padding))
            raise InputError(
                f"source row {b} is all padding (id {self.config.pad_id}): "
                "the encoder has no token to attend to"
            )
        return source


# ---------------------------------------------------------------------- MiniGPT


class GPTCache(NamedTuple):
    tok_embed: tuple
    pos_embed: tuple
    blocks: list
    final_norm: tuple
    head: tuple
    logits_shape: tuple


class MiniGPT(_Model):
    """Decoder-only character model: token + learned position embeddings, causal blocks."""

    kind = "gpt"  # how checkpoints and the PyTorch twin name this model

    @staticmethod
    def _init_params(cfg: GPTConfig, rng: np.random.Generator) -> dict:
        """N(0, 0.02) for embeddings and weight matrices, as GPT-2; zero biases."""

        def init(shape):
            return rng.normal(0.0, 0.02, shape)

        C, F = cfg.d_model, cfg.d_ff
        params = {
            "tok_embed.weight": init((cfg.vocab_size, C)),
            "pos_embed.weight": init((cfg.max_len, C)),
        }
        for i in range(cfg.n_layers):
            params.update(with_prefix(self_block_params(init, C, F), f"blocks.{i}."))
        params.update(with_prefix(layernorm_params(C), "final_norm."))
        params.update(with_prefix(linear_params(init, cfg.vocab_size, C), "head."))
        return in_one_buffer(params, cfg.dtype)

    def forward(self, idx: np.ndarray) -> tuple:
        """Logits (B, T, V) for idx (B, T) int ids, T <= max_len."""
        cfg, p = self.config, self.params
        idx = checks.check_token_ids("idx", idx, cfg.vocab_size)
        if idx.shape[1] > cfg.max_len:
            raise InputError(f"idx has {idx.shape[1]} positions but max_len is {cfg.max_len}")
        visible = causal_visible(idx.shape[1])  # (1, 1, T, T)

        x, tok_embed = embedding_forward(idx, p["tok_embed.weight"])  # (B, T, C)
        x, pos_embed = learned_positions_forward(x, p["pos_embed.weight"])
        blocks = []
        for i in range(cfg.n_layers):
            block_p = self._under(f"blocks.{i}.")
            x, block = self_attention_block_forward(
                x, block_p, cfg.n_heads, visible, cfg.activation
            )
            blocks.append(block)
        x, final_norm = layernorm_forward(x, p["final_norm.weight"], p["final_norm.bias"])
        logits, head = linear_forward(x, p["head.weight"], p["head.bias"])  # (B, T, V)
        return logits, GPTCache(tok_embed, pos_embed, blocks, final_norm, head, logits.shape)

    def backward(self, dlogits: np.ndarray, cache: GPTCache) -> dict[str, np.ndarray]:
        """Gradients of every parameter, keyed like self.params. See docs/gradients.md#models."""
        dlogits = checks.check_upstream_gradient(
            "dlogits", dlogits, cache.logits_shape, self.params["head.weight"].dtype
        )
        return self._backward(dlogits, cache)

    def _backward(self, dlogits: np.ndarray, cache: GPTCache) -> dict[str, np.ndarray]:
        grads: dict[str, np.ndarray] = {}
        dx, grads["head.weight"], grads["head.bias"] = linear_backward(dlogits, cache.head)
        dx, grads["final_norm.weight"], grads["final_norm.bias"] = layernorm_backward(
            dx, cache.final_norm
        )
        for i in reversed(range(len(cache.blocks))):
            dx, block_grads = self_attention_block_backward(dx, cache.blocks[i])
            grads.update(with_prefix(block_grads, f"blocks.{i}."))
        dx, grads["pos_embed.weight"] = learned_positions_backward(dx, cache.pos_embed)
        grads["tok_embed.weight"] = embedding_backward(dx, cache.tok_embed)
        return {key: grads[key] for key in self.params}

    def loss_and_grads(
        self, idx: np.ndarray, targets: np.ndarray
    ) -> tuple[float, dict[str, np.ndarray]]:
        """Mean next-token cross-entropy (targets of -100 are ignored) and its gradients."""
        logits, cache = self.forward(idx)
        targets = self._check_targets(targets, logits.shape[:2])
        return self._loss_and_grads(logits, cache, targets, GPT_IGNORE_INDEX)

    def loss(self, idx: np.ndarray, targets: np.ndarray) -> float:
        logits, _ = self.forward(idx)
        targets = self._check_targets(targets, logits.shape[:2])
        return float(cross_entropy_forward(logits, targets, GPT_IGNORE_INDEX)[0])

    def _check_targets(self, targets: np.ndarray, shape: tuple) -> np.ndarray:
        vocab = self.config.vocab_size
        return checks.check_targets("targets", targets, shape, vocab, GPT_IGNORE_INDEX, like="idx")
