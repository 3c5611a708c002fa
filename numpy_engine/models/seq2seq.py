"""The encoder-decoder (copy/reverse): config, model, and its step-by-step decoders.

A frozen config, a params dict keyed exactly like torch_reference's state_dict (linear
weights stored (out, in)), a forward that is one line per layer and a backward that is the
same list in reverse.

Shape legend: B batch, S source positions, T target positions, C = d_model, V vocabulary,
H heads, L tokens decoded so far.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from numpy_engine import checks
from numpy_engine.blocks import (
    decoder_block_backward,
    decoder_block_forward,
    self_attention_block_backward,
    self_attention_block_forward,
)
from numpy_engine.checks import InputError
from numpy_engine.dropout import check_rates, dropped, drops, site_mask
from numpy_engine.keys import with_prefix
from numpy_engine.layernorm import layernorm_backward, layernorm_forward
from numpy_engine.layers import (
    embedding_backward,
    embedding_forward,
    linear_backward,
    linear_forward,
    sinusoidal_backward,
    sinusoidal_forward,
    sinusoidal_table,
)
from numpy_engine.masks import causal_visible, padding_visible
from numpy_engine.models.base import (
    WEIGHT_COPIES,
    Model,
    check_sizes,
    readout_last,
    register,
)
from numpy_engine.multihead import (
    keys_values,
    memory_keys_values,
)
from numpy_engine.params import (
    decoder_block_params,
    layernorm_params,
    linear_params,
    self_block_params,
)


@dataclass(frozen=True)
class Seq2SeqConfig:
    vocab_size: int = 12
    d_model: int = 32
    n_heads: int = 4
    d_ff: int = 64
    n_encoder_layers: int = 1
    n_decoder_layers: int = 1
    activation: str = "relu"
    pad_id: int = 0  # padding: masked as a key, ignored as a target, its embedding row fixed
    dtype: str = "float32"
    bos_id: int = 1  # the decoder's first input
    eos_id: int = 2  # ends an output
    # dropout rates of training steps (dropout.py): after both embeddings, on every
    # attention's weights, and on each sublayer's output
    embed_dropout: float = 0.0
    attn_dropout: float = 0.0
    resid_dropout: float = 0.0

    def __post_init__(self) -> None:
        sizes = ("vocab_size", "d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers")
        check_sizes(self, sizes)
        check_rates(self)
        for name in ("pad_id", "bos_id", "eos_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise InputError(
                    f"{name}={getattr(self, name)} must be in [0, vocab_size={self.vocab_size})"
                )
        if len({self.pad_id, self.bos_id, self.eos_id}) < 3:
            raise InputError(
                f"pad_id, bos_id and eos_id must differ, got {self.pad_id}, {self.bos_id}, "
                f"{self.eos_id}"
            )


class EncoderCache(NamedTuple):
    src_embed: tuple
    blocks: list
    norm: tuple
    embed_drop: np.ndarray | None = None  # the embeddings' dropout mask (B, S, C)


class DecoderCache(NamedTuple):
    tgt_embed: tuple
    blocks: list
    norm: tuple
    readout: tuple
    embed_drop: np.ndarray | None = None  # (B, T, C)


class Seq2SeqCache(NamedTuple):
    encoder: EncoderCache
    decoder: DecoderCache
    logits_shape: tuple


@register
class Seq2SeqTransformer(Model):
    """Encoder-decoder with one embedding table shared by source and target."""

    kind = "seq2seq"
    config_class = Seq2SeqConfig
    torch_twin = "Seq2SeqTransformer"
    continues_prompt = False  # it reads a source and writes an output

    @staticmethod
    def _init_params(cfg: Seq2SeqConfig, rng: np.random.Generator) -> dict:
        """PyTorch's defaults for the weights: nn.Embedding's N(0, 1) (the padding row 0) and
        nn.Linear's U(+-1/sqrt(fan_in)); but the biases start at 0, where nn.Linear draws them
        from that uniform too (parity_tests/test_init.py)."""

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
        return params

    def forward(self, source: np.ndarray, decoder_input: np.ndarray, dropout=None) -> tuple:
        """Logits (B, T, V) for source (B, S) and decoder_input (B, T), both int ids.
        dropout: a training step's (dropout.py), whose masks the cache keeps."""
        memory, encoder = self.encode(source, dropout)
        logits, decoder = self.decode(memory, source, decoder_input, dropout)
        return logits, Seq2SeqCache(encoder, decoder, logits.shape)

    def encode(self, source: np.ndarray, dropout=None) -> tuple:
        """The memory (B, S, C) that every decoder block's cross-attention reads."""
        cfg, p = self.config, self.params
        source = self.check_source(source)
        src_visible = padding_visible(source, cfg.pad_id)  # (B, 1, 1, S)
        x, src_embed = embedding_forward(source, p["embed.weight"], cfg.pad_id)  # (B, S, C)
        x, _ = sinusoidal_forward(x)
        embed_drop = site_mask(dropout, "embed", x.shape, x.dtype)
        x = dropped(x, embed_drop)  # x is the positions' fresh sum
        blocks = []
        for i in range(cfg.n_encoder_layers):
            block_p = self._under(f"encoder.{i}.")
            x, block = self_attention_block_forward(
                x, block_p, cfg.n_heads, src_visible, cfg.activation, dropout=dropout
            )
            blocks.append(block)
        memory, norm = layernorm_forward(x, p["encoder_norm.weight"], p["encoder_norm.bias"])
        return memory, EncoderCache(src_embed, blocks, norm, embed_drop)

    def decode(
        self, memory: np.ndarray, source: np.ndarray, decoder_input: np.ndarray, dropout=None
    ) -> tuple:
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
        embed_drop = site_mask(dropout, "embed", y.shape, y.dtype)
        y = dropped(y, embed_drop)
        blocks = []
        for i in range(cfg.n_decoder_layers):
            block_p = self._under(f"decoder.{i}.")
            y, block = decoder_block_forward(
                y,
                memory,
                block_p,
                cfg.n_heads,
                tgt_visible,
                src_visible,
                cfg.activation,
                dropout=dropout,
            )
            blocks.append(block)
        y, norm = layernorm_forward(y, p["decoder_norm.weight"], p["decoder_norm.bias"])
        logits, readout = linear_forward(y, p["readout.weight"], p["readout.bias"])  # (B, T, V)
        return logits, DecoderCache(tgt_embed, blocks, norm, readout, embed_drop)

    def _backward(self, dlogits: np.ndarray, cache: Seq2SeqCache) -> dict[str, np.ndarray]:
        grads: dict[str, np.ndarray] = {}
        dmemory, dembed_tgt = self._decode_backward(dlogits, cache.decoder, grads)
        dembed_src = self._encode_backward(dmemory, cache.encoder, grads)
        grads["embed.weight"] = dembed_src + dembed_tgt  # one table fed source and target
        return {key: grads[key] for key in self.params}

    def _decode_backward(self, dlogits, cache: DecoderCache, grads: dict) -> tuple:
        """Fills grads for the decoder's parameters; returns (dmemory, the target's dembed)."""
        dy, readout_grads = linear_backward(dlogits, cache.readout)  # logits = readout(y)
        dy, norm_grads = layernorm_backward(dy, cache.norm)  # forward was y = decoder_norm(y)
        grads |= with_prefix(readout_grads, "readout.") | with_prefix(norm_grads, "decoder_norm.")
        dmemory = 0.0
        for i in reversed(range(len(cache.blocks))):  # forward was y = block_i(y, memory)
            dy, dmemory_i, block_grads = decoder_block_backward(dy, cache.blocks[i])
            dmemory = dmemory + dmemory_i  # memory fed every decoder block's cross-attention
            grads |= with_prefix(block_grads, f"decoder.{i}.")
        # forward was y = drop(embed[decoder_input] + sinusoid[t]); dy is a block's fresh dy
        dy = dropped(dy, cache.embed_drop)
        _, embed_grads = embedding_backward(sinusoidal_backward(dy, None), cache.tgt_embed)
        return dmemory, embed_grads["weight"]

    def _encode_backward(self, dmemory, cache: EncoderCache, grads: dict) -> np.ndarray:
        """Fills grads for the encoder's parameters; returns the source's dembed."""
        dx, norm_grads = layernorm_backward(dmemory, cache.norm)  # memory = encoder_norm(x)
        grads |= with_prefix(norm_grads, "encoder_norm.")
        for i in reversed(range(len(cache.blocks))):  # forward was x = block_i(x)
            dx, block_grads = self_attention_block_backward(dx, cache.blocks[i])
            grads |= with_prefix(block_grads, f"encoder.{i}.")
        # forward was x = drop(embed[source] + sinusoid[t]); dx is a block's fresh dx
        dx = dropped(dx, cache.embed_drop)
        _, embed_grads = embedding_backward(sinusoidal_backward(dx, None), cache.src_embed)
        return embed_grads["weight"]

    def loss_and_grads(
        self, source: np.ndarray, decoder_input: np.ndarray, target: np.ndarray, dropout_rng=None
    ) -> tuple[float, dict[str, np.ndarray]]:
        """Mean cross-entropy over non-padding targets, and its gradient for every parameter;
        with dropout_rng (a training step's), the config's dropout applies, masks from it."""
        return self._loss_and_grads((source, decoder_input), target, dropout_rng)

    def loss(
        self, source: np.ndarray, decoder_input: np.ndarray, target: np.ndarray, dropout_rng=None
    ) -> float:
        """The loss alone (evaluation); with dropout_rng, a training step's under its masks."""
        return self._loss((source, decoder_input), target, dropout_rng)

    def _targets(self, target: np.ndarray, logits: np.ndarray) -> np.ndarray:
        cfg = self.config
        return checks.check_targets(
            "target", target, logits.shape[:2], cfg.vocab_size, cfg.pad_id, like="decoder_input"
        )

    def ignore_index(self) -> int:
        return self.config.pad_id

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

    # ------------------------------------------------------------- decoding, study

    def decoder(self, source: np.ndarray, use_cache: bool = True):
        source = self.check_source(source)  # ids in the vocabulary, no all-padding row
        return (CachedSeq2SeqDecoder if use_cache else RerunSeq2SeqDecoder)(self, source)

    def attention_panels(self, source: np.ndarray, labels: list[str]) -> list[tuple]:
        """Encoder self, decoder self and cross-attention per layer, over the greedy output."""
        from numpy_engine.generate import greedy_decode  # generate.py builds on the models

        cfg, src = self.config, np.asarray(source)[None]
        generated = greedy_decode(self, src, max_new_tokens=src.shape[1] + 1)[0]
        out_tokens = [int(t) for t in generated if t != cfg.pad_id]
        decoder_input = np.array([[cfg.bos_id, *out_tokens[:-1]]])
        _, cache = self.forward(src, decoder_input)
        dec_labels = ["BOS", *[str(t) for t in decoder_input[0, 1:]]]
        panels = []
        for i, block in enumerate(cache.encoder.blocks):
            panels.append((f"encoder {i} self", block.attn.attention.weights[0], labels, labels))
        for i, block in enumerate(cache.decoder.blocks):
            weights = block.self_attn.attention.weights[0]
            panels.append((f"decoder {i} self", weights, dec_labels, dec_labels))
            weights = block.cross_attn.attention.weights[0]
            panels.append((f"decoder {i} cross", weights, labels, dec_labels))
        return panels

    @staticmethod
    def example_batch(cfg: Seq2SeqConfig, rng, batch_size: int, length: int | None = None):
        """Sources of length, length - 1, ..., 1, length, ... ids (not special; default
        length 3), then PAD; the output copies them, then EOS."""
        length = 3 if length is None else length
        specials = (cfg.pad_id, cfg.bos_id, cfg.eos_id)
        symbols = np.setdiff1d(np.arange(cfg.vocab_size), specials)
        lengths = length - np.arange(batch_size) % length  # every padding pattern
        tokens = rng.choice(symbols, size=(batch_size, length))
        tokens = np.where(np.arange(length) < lengths[:, None], tokens, cfg.pad_id)  # (B, S)
        decoder_input = np.concatenate([np.full((batch_size, 1), cfg.bos_id), tokens], axis=1)
        target = np.concatenate([tokens, np.full((batch_size, 1), cfg.pad_id)], axis=1)
        target[np.arange(batch_size), lengths] = cfg.eos_id  # EOS after the last token
        return tokens, decoder_input, target

    @staticmethod
    def forward_flops(cfg: Seq2SeqConfig, batch_size: int, length: int) -> float:
        C, F, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
        B, S, T = batch_size, length, length + 1
        enc = 2 * B * S * (4 * C * C + 2 * C * F) + 4 * B * S * S * C
        dec = 2 * B * T * (4 * C * C + 2 * C * F) + 4 * B * T * T * C  # self-attention + FFN
        dec += 2 * B * T * 2 * C * C + 2 * B * S * 2 * C * C + 4 * B * T * S * C  # cross-attention
        return cfg.n_encoder_layers * enc + cfg.n_decoder_layers * dec + 2 * B * T * C * V

    @staticmethod
    def step_values(cfg: Seq2SeqConfig, batch_size: int, length: int) -> int:
        """Per layer and token ~16 d_model + 4 d_ff cached values and gradients, 3 per attention
        score (scores, weights, their gradient); 4 per logit (logits, log-probs, gradient,
        copy); the stacked projection weights each layer keeps, 3 C^2 in an encoder layer
        and 5 C^2 in a decoder layer (q, k, v and the cross-attention's k, v); and
        WEIGHT_COPIES of a decoder block's weights or of the embedding, whichever is larger
        (the source's and the target's gradients of the shared table are summed). With
        dropout, each layer keeps its masks too (its weights' and three outputs'), and one
        dropped copy of weights and of an output lives at a time."""
        C, F = cfg.d_model, cfg.d_ff
        B, S, T = batch_size, length, length + 1
        layers = cfg.n_encoder_layers + cfg.n_decoder_layers
        cells = B * cfg.n_heads * (S + T) ** 2  # self- and cross-attention
        per_token = 16 * C + 4 * F
        kept = (3 * cfg.n_encoder_layers + 5 * cfg.n_decoder_layers) * C * C
        decoder_block = 8 * C * C + 2 * C * F  # two attentions' four projections, the FFN
        largest = max(decoder_block, cfg.vocab_size * C)
        activations = layers * (B * (S + T) * per_token + 3 * cells) + 4 * B * T * cfg.vocab_size
        if drops(cfg):
            activations += _dropout_values(cfg, B, S, T)
        return activations + kept + WEIGHT_COPIES * largest


def _dropout_values(cfg: Seq2SeqConfig, B: int, S: int, T: int) -> int:
    """The masks a step with dropout keeps: per encoder layer its weights' (S x S per head)
    and two outputs', per decoder layer its two attentions' (T x (T + S)) and three
    outputs', and the two embeddings'; and one dropped copy of weights and of an output."""
    C, H = cfg.d_model, cfg.n_heads
    encoder_layer = B * H * S * S + 2 * B * S * C
    decoder_cells = B * H * T * (T + S)
    decoder_layer = decoder_cells + 3 * B * T * C
    embeddings = B * (S + T) * C
    layers = cfg.n_encoder_layers * encoder_layer + cfg.n_decoder_layers * decoder_layer
    return layers + embeddings + decoder_cells + B * max(S, T) * C


class RerunSeq2SeqDecoder:
    """The simple path: the source is encoded once; every step reruns the decoder on the prefix."""

    def __init__(self, model: Seq2SeqTransformer, source: np.ndarray) -> None:
        self.model, self.source = model, source
        self.memory, _ = model.encode(source)  # (B, S, C)
        self.decoder_input = np.full((source.shape[0], 1), model.config.bos_id)  # (B, 1)

    def next_logits(self) -> np.ndarray:
        logits, _ = self.model.decode(self.memory, self.source, self.decoder_input)
        return logits[:, -1]

    def append(self, next_ids: np.ndarray) -> None:
        self.decoder_input = np.concatenate([self.decoder_input, next_ids[:, None]], axis=1)


class CachedSeq2SeqDecoder:
    """Cross-attention keys/values over the source once; self-attention keys/values kept, so a
    step runs only the new position through the very blocks training runs."""

    def __init__(self, model: Seq2SeqTransformer, source: np.ndarray) -> None:
        self.model, cfg = model, model.config
        self.memory, _ = model.encode(source)  # (B, S, C)
        self.memory_visible = padding_visible(source, cfg.pad_id)  # (B, 1, 1, S)
        self.memory_kv = []  # per block: keys and values over the source, (B, H, S, hs) each
        for i in range(cfg.n_decoder_layers):
            cross_p = model._under(f"decoder.{i}.cross_attn.")
            self.memory_kv.append(memory_keys_values(self.memory, cross_p, cfg.n_heads)[0])
        self.kv = [None] * cfg.n_decoder_layers  # per block: self-attention keys and values
        self.is_token = np.zeros((source.shape[0], 0), dtype=bool)  # (B, L): keys that are not PAD
        self._logits = self._run(np.full(source.shape[0], cfg.bos_id))

    def next_logits(self) -> np.ndarray:
        return self._logits

    def append(self, next_ids: np.ndarray) -> None:
        self._logits = self._run(next_ids)

    def _run(self, ids: np.ndarray) -> np.ndarray:
        """Feed ids (B,) at the next position; logits (B, V) for the position after it."""
        cfg, p = self.model.config, self.model.params
        t = self.is_token.shape[1]
        position = sinusoidal_table(t + 1, cfg.d_model, p["embed.weight"].dtype)[t]  # (C,)
        x = p["embed.weight"][ids][:, None] + position  # (B, 1, C)
        self.is_token = np.concatenate([self.is_token, (ids != cfg.pad_id)[:, None]], axis=1)
        self_visible = self.is_token[:, None, None, :]  # (B, 1, 1, t + 1); earlier keys only
        for i, past in enumerate(self.kv):
            x, block = decoder_block_forward(
                x,
                self.memory,
                self.model._under(f"decoder.{i}."),
                cfg.n_heads,
                self_visible,
                self.memory_visible,
                cfg.activation,
                past,
                self.memory_kv[i],
                for_backward=False,
            )
            self.kv[i] = keys_values(block.self_attn)
        norm = p["decoder_norm.weight"], p["decoder_norm.bias"]
        return readout_last(x, norm, (p["readout.weight"], p["readout.bias"]))
