"""GPT-2's PyTorch twin: Hugging Face transformers' GPT2LMHeadModel with an engine model's
weights, wrapped to answer as torch_reference's models do (forward(idx) -> logits, loss(idx,
targets)), and to name its gradients as the engine does."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from numpy_engine.hf import engine_params_from_hf, hf_config_from_engine, hf_state_from_engine
from numpy_engine.models import IGNORE_INDEX


class GPT2Twin(nn.Module):
    def __init__(self, engine_model) -> None:
        from transformers import GPT2Config, GPT2LMHeadModel

        super().__init__()
        config = engine_model.config
        settings = hf_config_from_engine(config) | {"attn_implementation": "eager"}
        dtype = torch.float64 if config.dtype == "float64" else torch.float32
        self.hf = GPT2LMHeadModel(GPT2Config(**settings)).to(dtype).eval()
        self.n_layers = config.n_layers
        state = hf_state_from_engine(engine_model.params, config.n_layers)
        tensors = {key: torch.from_numpy(value.copy()) for key, value in state.items()}
        missing, unexpected = self.hf.load_state_dict(tensors, strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise RuntimeError(f"GPT-2 twin: missing {missing}, unexpected {unexpected}")
        self.hf.tie_weights()  # lm_head is wte

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.hf(idx).logits

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """As the engine's: F.cross_entropy on the logits (transformers' own loss upcasts to
        float32), -100 ignored."""
        logits = self(idx)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)

    def engine_named(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Arrays keyed by this module's parameter names, keyed and laid out as the engine's."""
        hf = {key.removeprefix("hf."): value for key, value in tensors.items()}
        return engine_params_from_hf(hf, self.n_layers)
