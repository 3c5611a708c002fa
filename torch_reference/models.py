"""Seq2SeqTransformer and MiniGPT in PyTorch, state_dict keys identical to numpy_engine's params."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from torch_reference.modules import (
    DecoderBlock,
    SelfAttentionBlock,
    causal_visible,
    dropout,
    padding_visible,
    sinusoidal_table,
)

GPT_IGNORE_INDEX = -100


class Seq2SeqTransformer(nn.Module):
    def __init__(
        self,
        vocab_size: int = 12,
        d_model: int = 32,
        n_heads: int = 4,
        d_ff: int = 64,
        n_encoder_layers: int = 1,
        n_decoder_layers: int = 1,
        activation: str = "relu",
        pad_id: int = 0,
        embed_dropout: float = 0.0,
        attn_dropout: float = 0.0,
        resid_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.drop = dropout(embed_dropout)
        block_args = (d_model, n_heads, d_ff, activation, attn_dropout, resid_dropout)
        self.encoder = nn.ModuleList(
            SelfAttentionBlock(*block_args) for _ in range(n_encoder_layers)
        )
        self.encoder_norm = nn.LayerNorm(d_model, eps=1e-5)
        self.decoder = nn.ModuleList(DecoderBlock(*block_args) for _ in range(n_decoder_layers))
        self.decoder_norm = nn.LayerNorm(d_model, eps=1e-5)
        self.readout = nn.Linear(d_model, vocab_size)

    def embed_with_positions(self, ids):
        x = self.embed(ids)  # (B, T, C)
        return self.drop(x + sinusoidal_table(ids.shape[1], x.shape[2], x.dtype))

    def forward(self, source, decoder_input):
        src_visible = padding_visible(source, self.pad_id)  # (B, 1, 1, S)
        T = decoder_input.shape[1]
        tgt_visible = causal_visible(T) & padding_visible(decoder_input, self.pad_id)
        x = self.embed_with_positions(source)
        for block in self.encoder:
            x = block(x, src_visible)
        memory = self.encoder_norm(x)
        y = self.embed_with_positions(decoder_input)
        for block in self.decoder:
            y = block(y, memory, tgt_visible, src_visible)
        return self.readout(self.decoder_norm(y))  # (B, T, V)

    def loss(self, source, decoder_input, target):
        logits = self(source, decoder_input)
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=self.pad_id)


class MiniGPT(nn.Module):
    def __init__(
        self,
        vocab_size: int = 13,
        d_model: int = 64,
        n_heads: int = 4,
        d_ff: int = 256,
        n_layers: int = 3,
        max_len: int = 32,
        activation: str = "gelu",
        embed_dropout: float = 0.0,
        attn_dropout: float = 0.0,
        resid_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.tok_embed = nn.Embedding(vocab_size, d_model)
        self.pos_embed = nn.Embedding(max_len, d_model)
        self.drop = dropout(embed_dropout)
        block_args = (d_model, n_heads, d_ff, activation, attn_dropout, resid_dropout)
        self.blocks = nn.ModuleList(SelfAttentionBlock(*block_args) for _ in range(n_layers))
        self.final_norm = nn.LayerNorm(d_model, eps=1e-5)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.drop(self.tok_embed(idx) + self.pos_embed.weight[:T])  # (B, T, C)
        visible = causal_visible(T)
        for block in self.blocks:
            x = block(x, visible)
        return self.head(self.final_norm(x))  # (B, T, V)

    def loss(self, idx, targets):
        logits = self(idx)
        return F.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), ignore_index=GPT_IGNORE_INDEX
        )
