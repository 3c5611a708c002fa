"""GPT-2: MiniGPT's architecture with the output head tied to the token embedding.

logits = ln_f(x) @ wte.T, no bias. wte is then used twice, to embed the ids and to read
out the logits, so its gradient is the sum of both uses (docs/gradients.md#tied-head).
Parameter names are MiniGPT's (tok_embed = wte, pos_embed = wpe, blocks.i = h.i,
final_norm = ln_f); numpy_engine/hf.py maps them to and from Hugging Face's files.

Shape legend: B batch, T positions, C = d_model, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from numpy_engine.layers import embedding_row_grads
from numpy_engine.models.base import register
from numpy_engine.models.minigpt import GPTConfig, MiniGPT, trunk_params

# The sizes of the released checkpoints (Hugging Face's config.json for each)
PRESETS = {
    "gpt2": dict(vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=12, max_len=1024),
}


@dataclass(frozen=True)
class GPT2Config(GPTConfig):
    """A small GPT-2 by default; GPT2Config.preset("gpt2") has the 124M model's sizes."""

    vocab_size: int = 64
    d_model: int = 32
    n_heads: int = 4
    d_ff: int = 128
    n_layers: int = 2
    max_len: int = 64
    activation: str = "gelu"  # Hugging Face's gelu_new: the tanh form
    dtype: str = "float32"
    eos_id: int | None = None  # <|endoftext|> (50256 in the released tokenizer)

    @classmethod
    def preset(cls, name: str, **changes) -> GPT2Config:
        return cls(**(PRESETS[name] | {"eos_id": 50256} | changes))


RESIDUAL_PROJECTIONS = ("attn.out_proj.weight", "ffn.fc2.weight")  # write into the residual


@register
class GPT2(MiniGPT):
    """GPT2LMHeadModel's computation: learned positions, pre-norm causal blocks, tied head."""

    kind = "gpt2"
    config_class = GPT2Config
    torch_twin = "transformers.GPT2LMHeadModel"  # crosscheck/hf_twin.py; parity_tests/test_gpt2.py

    @staticmethod
    def _init_params(cfg: GPT2Config, rng: np.random.Generator) -> dict:
        """GPT-2's: N(0, 0.02) weights and embeddings, zero biases, unit layernorms; the two
        projections that write into the residual stream N(0, 0.02 / sqrt(2 n_layers))."""

        params = trunk_params(cfg, rng)  # MiniGPT's, drawn in the same order
        for i in range(cfg.n_layers):
            for key in RESIDUAL_PROJECTIONS:
                params[f"blocks.{i}.{key}"] /= math.sqrt(2 * cfg.n_layers)
        return params

    def _head(self) -> tuple:
        return self.params["tok_embed.weight"], None  # tied: the embedding, no bias

    def _head_and_embedding_grads(self, head_grads: dict, dx: np.ndarray, tok_cache) -> dict:
        # wte fed the embedding and the head: dwte = dwte_head + dwte_embed, where the
        # embedding's term is nonzero only on the rows of the ids it read, so those rows are
        # added into the head's (fresh) gradient, not a (V, C) table of zeros
        dwte = head_grads["weight"]
        ids, row_grads = embedding_row_grads(dx, tok_cache)
        dwte[ids] += row_grads  # ids are distinct: no repeat is dropped
        return {"tok_embed.weight": dwte}
