"""Step-by-step decoders: the simple path that reruns the whole prefix, and the KV-cached one.

Each decoder offers `next_logits()` -> (B, V), the logits for the next token, and
`append(next_ids)` to feed the chosen ids (B,). The cached decoders keep every
layer's self-attention keys and values, so a step computes only the new position;
the encoder-decoder's cross-attention keys and values over the source are computed
once. Both give the same logits (tested to 1e-12 in float64).

Shape legend: B batch, H heads, L tokens so far, S source positions, C channels.
"""

from __future__ import annotations

import numpy as np

from numpy_engine.attention import attention_forward, merge_heads, padding_visible, split_heads
from numpy_engine.blocks import sub
from numpy_engine.layers import (
    ffn_forward,
    layernorm_forward,
    linear_forward,
    sinusoidal_table,  # fmt: skip
)
from numpy_engine.models import MiniGPT, Seq2SeqTransformer
from numpy_engine.tasks import BOS


def _project(x: np.ndarray, p: dict, name: str, n_heads: int) -> np.ndarray:
    out, _ = linear_forward(x, p[f"{name}.weight"], p[f"{name}.bias"])
    return split_heads(out, n_heads)  # (B, H, T, hs)


def _layernorm(x: np.ndarray, p: dict, name: str) -> np.ndarray:
    return layernorm_forward(x, p[f"{name}.weight"], p[f"{name}.bias"])[0]


class LayerKV:
    """One attention layer's keys and values so far: (B, H, L, hs) each."""

    def __init__(self) -> None:
        self.k: np.ndarray | None = None
        self.v: np.ndarray | None = None

    def extend(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.k = k if self.k is None else np.concatenate([self.k, k], axis=2)
        self.v = v if self.v is None else np.concatenate([self.v, v], axis=2)
        return self.k, self.v


def _cached_attention(x, p, n_heads, kv: LayerKV, visible) -> np.ndarray:
    """Self-attention of the new positions x (B, n, C) over every cached position and themselves."""
    q = _project(x, p, "q_proj", n_heads)  # (B, H, n, hs)
    k, v = kv.extend(_project(x, p, "k_proj", n_heads), _project(x, p, "v_proj", n_heads))
    y, _ = attention_forward(q, k, v, visible)  # (B, H, n, hs)
    out, _ = linear_forward(merge_heads(y), p["out_proj.weight"], p["out_proj.bias"])
    return out  # (B, n, C)


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
        self.kv = [LayerKV() for _ in range(self.model.config.n_layers)]
        self.length = 0
        self._logits = self._run(window)

    def _run(self, new_ids: np.ndarray) -> np.ndarray:
        """Feed new_ids (B, n) at positions length .. length + n - 1; logits of the last."""
        cfg, p = self.model.config, self.model.params
        start, n = self.length, new_ids.shape[1]
        x = p["tok_embed.weight"][new_ids] + p["pos_embed.weight"][start : start + n]  # (B, n, C)
        # query i (position start + i) sees keys 0 .. start + i
        visible = (np.arange(start + n)[None, :] <= start + np.arange(n)[:, None])[None, None]
        for i, kv in enumerate(self.kv):
            block = sub(p, f"blocks.{i}.")
            x = x + _cached_attention(_layernorm(x, block, "ln1"), sub(block, "attn."),
                                      cfg.n_heads, kv, visible)  # fmt: skip
            x = x + ffn_forward(_layernorm(x, block, "ln2"), sub(block, "ffn."), cfg.activation)[0]
        self.length = start + n
        x = _layernorm(x[:, -1:], p, "final_norm")
        logits, _ = linear_forward(x, p["head.weight"], p["head.bias"])
        return logits[:, 0]  # (B, V)


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
        memory, _ = model.encode(source)  # (B, S, C)
        self.memory_visible = padding_visible(source, cfg.pad_id)  # (B, 1, 1, S)
        self.cross = []  # per block: keys and values over the source, (B, H, S, hs) each
        for i in range(cfg.n_decoder_layers):
            p = sub(model.params, f"decoder.{i}.cross_attn.")
            self.cross.append((_project(memory, p, "k_proj", cfg.n_heads),
                               _project(memory, p, "v_proj", cfg.n_heads)))  # fmt: skip
        self.kv = [LayerKV() for _ in range(cfg.n_decoder_layers)]
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
        for i, kv in enumerate(self.kv):
            block = sub(p, f"decoder.{i}.")
            x = x + _cached_attention(_layernorm(x, block, "ln1"), sub(block, "self_attn."),
                                      cfg.n_heads, kv, self_visible)  # fmt: skip
            x = x + self._cross_attention(_layernorm(x, block, "ln2"), sub(block, "cross_attn."), i)
            x = x + ffn_forward(_layernorm(x, block, "ln3"), sub(block, "ffn."), cfg.activation)[0]
        x = _layernorm(x, p, "decoder_norm")
        logits, _ = linear_forward(x, p["readout.weight"], p["readout.bias"])
        return logits[:, 0]

    def _cross_attention(self, x: np.ndarray, p: dict, i: int) -> np.ndarray:
        k, v = self.cross[i]
        q = _project(x, p, "q_proj", self.model.config.n_heads)  # (B, H, 1, hs)
        y, _ = attention_forward(q, k, v, self.memory_visible)
        out, _ = linear_forward(merge_heads(y), p["out_proj.weight"], p["out_proj.bias"])
        return out
