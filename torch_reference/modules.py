"""Building blocks as torch.nn.Modules: attention, feed-forward, pre-norm blocks.

Parameter names match numpy_engine's params keys one for one (q_proj.weight, ln1.bias, ...).
Shape legend: B batch, H heads, T / S target / source positions, C channels, hs = C // H.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def padding_visible(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, T): keys that are not padding


def causal_visible(T: int, device: torch.device | None = None) -> torch.Tensor:
    return torch.tril(torch.ones(T, T, dtype=torch.bool, device=device))[None, None]


def sinusoidal_table(T: int, C: int, dtype: torch.dtype) -> torch.Tensor:
    """pe[p, 2i] = sin(p / 10000^(2i/C)), pe[p, 2i+1] = cos(p / 10000^(2i/C))."""
    position = torch.arange(T, dtype=torch.float64)[:, None]
    inv_freq = torch.exp(torch.arange(0, C, 2, dtype=torch.float64) * (-math.log(10000.0) / C))
    table = torch.zeros(T, C, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: C // 2])
    return table.to(dtype)  # (T, C)


def dropout(rate: float) -> nn.Module:
    """nn.Dropout(rate), or nothing to call at all when rate is 0."""
    return nn.Dropout(rate) if rate > 0 else nn.Identity()


def attention(q, k, v, visible: torch.Tensor | None, dropout_p: float = 0.0) -> torch.Tensor:
    """PyTorch's own scaled_dot_product_attention; a bool attn_mask is True where visible.
    With dropout on the weights, written out instead, so that the mask is F.dropout's (which
    a test can replace) and not drawn inside the fused kernel."""
    if visible is not None:
        rows = visible.any(dim=-1).expand(q.shape[:-1])  # (B, H, Tq)
        if not bool(rows.all()):
            b, h, t = (int(i) for i in torch.nonzero(~rows)[0])
            raise ValueError(
                f"visible: the query at batch row {b}, position {t} (head {h}) has no visible key"
            )
    if dropout_p == 0:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return F.dropout(torch.softmax(scores, dim=-1), dropout_p, training=True) @ v


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, attn_dropout: float = 0.0) -> None:
        super().__init__()
        self.n_heads, self.attn_dropout = n_heads, attn_dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, memory, visible):
        B, Tq, C = x.shape
        H, Tk = self.n_heads, memory.shape[1]
        q = self.q_proj(x).view(B, Tq, H, C // H).transpose(1, 2)  # (B, H, Tq, hs)
        k = self.k_proj(memory).view(B, Tk, H, C // H).transpose(1, 2)  # (B, H, Tk, hs)
        v = self.v_proj(memory).view(B, Tk, H, C // H).transpose(1, 2)  # (B, H, Tk, hs)
        rate = self.attn_dropout if self.training else 0.0
        y = attention(q, k, v, visible, rate).transpose(1, 2).reshape(B, Tq, C)
        return self.out_proj(y)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, activation: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.activation = activation

    def forward(self, x):
        h = self.fc1(x)
        h = F.relu(h) if self.activation == "relu" else F.gelu(h, approximate="tanh")
        return self.fc2(h)


class SelfAttentionBlock(nn.Module):
    """Pre-norm encoder block; under a causal mask, the decoder-only block."""

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, activation: str, attn_dropout=0.0, drop=0.0
    ) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=1e-5)
        self.attn = MultiHeadAttention(d_model, n_heads, attn_dropout)
        self.ln2 = nn.LayerNorm(d_model, eps=1e-5)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.drop = dropout(drop)  # on each sublayer's output (resid_dropout)

    def forward(self, x, visible):
        xn = self.ln1(x)
        h = x + self.drop(self.attn(xn, xn, visible))
        return h + self.drop(self.ffn(self.ln2(h)))


class DecoderBlock(nn.Module):
    """Pre-norm: causal self-attention, cross-attention over the memory, feed-forward."""

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, activation: str, attn_dropout=0.0, drop=0.0
    ) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=1e-5)
        self.self_attn = MultiHeadAttention(d_model, n_heads, attn_dropout)
        self.ln2 = nn.LayerNorm(d_model, eps=1e-5)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attn_dropout)
        self.ln3 = nn.LayerNorm(d_model, eps=1e-5)
        self.ffn = FeedForward(d_model, d_ff, activation)
        self.drop = dropout(drop)  # on each sublayer's output (resid_dropout)

    def forward(self, y, memory, self_visible, memory_visible):
        yn = self.ln1(y)
        h1 = y + self.drop(self.self_attn(yn, yn, self_visible))
        h2 = h1 + self.drop(self.cross_attn(self.ln2(h1), memory, memory_visible))
        return h2 + self.drop(self.ffn(self.ln3(h2)))
