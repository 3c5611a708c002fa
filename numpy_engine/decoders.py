"""Step-by-step decoders: the simple path that reruns the whole prefix, and the KV-cached one.

Each decoder offers `next_logits()` -> (B, V), the logits for the next token, and
`append(next_ids)` to feed the chosen ids (B,). The cached decoders keep every
layer's self-attention keys and values, so a step computes only the new position;
the encoder-decoder's cross-attention keys and values over the source are computed
once. They run the very blocks that training runs (blocks.py), handing each its past keys
and values. Both give the same logits (tested to 1e-12 in float64).

Shape legend: B batch, H heads, L tokens so far, S source positions, C channels.
"""

from __future__ import annotations

import numpy as np

from numpy_engine.attention import keys_values, memory_keys_values, padding_visible
from numpy_engine.blocks import decoder_block_forward, self_attention_block_forward, sub
from numpy_engine.layers import layernorm_forward, linear_forward, sinusoidal_table
from numpy_engine.models import MiniGPT, Seq2SeqTransformer
from numpy_engine.tasks import BOS


def _readout(x: np.ndarray, p: dict, norm: str, head: str) -> np.ndarray:
    """The final layernorm and the output projection, on the last position: logits (B, V)."""
    x, _ = layernorm_forward(x[:, -1:], p[f"{norm}.weight"], p[f"{norm}.bias"])
    logits, _ = linear_forward(x, p[f"{head}.weight"], p[f"{head}.bias"])
    return logits[:, 0]


# --------------------------------------------------------------------------- MiniGPT


class FullGPTDecoder:
    """The simple path: every step reruns the model on the last max_len ids."""

    def __init__(self, model: MiniGPT, prompt: np.ndarray) -> None:
        self.model, self.ids = model, prompt  # (B, T0)

    def next_logits(self) -> np.ndarray:
        logits, _ = self.model.forward(self.ids[:, -self.model.config.max_len :])
        return logits[:, -1]  # (B, V)

    def append(self, next_ids: np.ndarray) -> None:
        self.ids = np.concatenate([self.ids, next_ids[:, None]], axis=1)


class CachedGPTDecoder:
    """Keeps each block's keys and values; a step runs one position through the model.

    Learned positions are absolute, so once the ids outgrow max_len the window slides,
    every position shifts, and the cache is rebuilt from the new window.
    """

    def __init__(self, model: MiniGPT, prompt: np.ndarray) -> None:
        self.model, self.ids = model, prompt
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
        """Feed new_ids (B, n) at positions length .. length + n - 1; logits of the last."""
        cfg, p = self.model.config, self.model.params
        start, n = self.length, new_ids.shape[1]
        x = p["tok_embed.weight"][new_ids] + p["pos_embed.weight"][start : start + n]  # (B, n, C)
        # query i (position start + i) sees keys 0 .. start + i
        visible = (np.arange(start + n)[None, :] <= start + np.arange(n)[:, None])[None, None]
        for i, past in enumerate(self.kv):
            block_p = sub(p, f"blocks.{i}.")
            x, block = self_attention_block_forward(
                x, block_p, cfg.n_heads, visible, cfg.activation, past
            )
            self.kv[i] = keys_values(block.attn)
        self.length = start + n
        return _readout(x, p, "final_norm", "head")


# ------------------------------------------------------------------- encoder-decoder


class FullSeq2SeqDecoder:
    """The simple path: the source is encoded once; every step reruns the decoder on the prefix."""

    def __init__(self, model: Seq2SeqTransformer, source: np.ndarray) -> None:
        self.model, self.source = model, source
        self.memory, _ = model.encode(source)  # (B, S, C)
        self.decoder_input = np.full((source.shape[0], 1), BOS)  # (B, 1)

    def next_logits(self) -> np.ndarray:
        logits, _ = self.model.decode(self.memory, self.source, self.decoder_input)
        return logits[:, -1]

    def append(self, next_ids: np.ndarray) -> None:
        self.decoder_input = np.concatenate([self.decoder_input, next_ids[:, None]], axis=1)


class CachedSeq2SeqDecoder:
    """Cross-attention keys/values over the source once; self-attention keys/values kept."""

    def __init__(self, model: Seq2SeqTransformer, source: np.ndarray) -> None:
        self.model, cfg = model, model.config
        self.memory, _ = model.encode(source)  # (B, S, C)
        self.memory_visible = padding_visible(source, cfg.pad_id)  # (B, 1, 1, S)
        self.memory_kv = []  # per block: keys and values over the source, (B, H, S, hs) each
        for i in range(cfg.n_decoder_layers):
            cross_p = sub(model.params, f"decoder.{i}.cross_attn.")
            self.memory_kv.append(memory_keys_values(self.memory, cross_p, cfg.n_heads)[0])
        self.kv = [None] * cfg.n_decoder_layers  # per block: self-attention keys and values
        self.is_token = np.zeros((source.shape[0], 0), dtype=bool)  # (B, L): keys that are not PAD
        self._logits = self._run(np.full(source.shape[0], BOS))

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
                sub(p, f"decoder.{i}."),
                cfg.n_heads,
                self_visible,
                self.memory_visible,
                cfg.activation,
                past,
                self.memory_kv[i],
            )
            self.kv[i] = keys_values(block.self_attn)
        return _readout(x, p, "decoder_norm", "readout")
