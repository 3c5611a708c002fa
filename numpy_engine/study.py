"""What the `grads` and `attention` commands show: gradient norms next to their finite-difference
estimates, and the attention weights of every layer and head for one example."""

from __future__ import annotations

import numpy as np

import numpy_engine as ne
from numpy_engine.checks import InputError
from numpy_engine.generate import greedy_decode
from numpy_engine.gradcheck import check_gradient, sample_indices
from numpy_engine.tasks import BOS, EOS, PAD


def example_batch(kind: str, seed: int) -> tuple:
    """The default model of that kind in float64, and one padded batch, all from seed."""
    rng = np.random.default_rng(seed)
    if kind == "seq2seq":
        model = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(dtype="float64"), seed=seed)
        lengths = np.array([3, 2, 1, 3])
        tokens = rng.integers(4, 12, size=(4, 3)) * (np.arange(3) < lengths[:, None])  # (B, 3)
        decoder_input = np.concatenate([np.full((4, 1), BOS), tokens], axis=1)  # BOS + tokens
        target = np.concatenate([tokens, np.full((4, 1), PAD)], axis=1)
        target[np.arange(4), lengths] = EOS  # EOS after the last token, then padding
        return model, (tokens, decoder_input, target)
    if kind != "gpt":
        raise InputError(f"model must be 'seq2seq' or 'gpt', got {kind!r}")
    model = ne.MiniGPT(ne.GPTConfig(dtype="float64"), seed=seed)
    idx = rng.integers(0, 13, size=(4, 32))
    targets = np.roll(idx, -1, axis=1)
    targets[:, -1] = -100
    targets[1, 20:] = -100  # a padded row
    return model, (idx, targets)


def gradient_study(kind: str, seed: int, entries: int = 4) -> tuple[float, list[dict]]:
    """The loss, and per parameter: gradient norm, and on `entries` sampled entries the
    analytic values' norm, the finite-difference estimate's norm, and their relative error."""
    model, batch = example_batch(kind, seed)
    loss, grads = model.loss_and_grads(*batch)
    rng = np.random.default_rng(seed)
    rows = []
    for key, param in model.params.items():
        indices = sample_indices(rng, param.size, entries)
        # judged against the finite difference's own rounding (a key bias's true gradient is 0)
        check = check_gradient(lambda: model.loss(*batch), param, grads[key], indices)
        analytic = grads[key].reshape(-1)[indices]
        rows.append(
            {
                "name": key,
                "shape": param.shape,
                "grad_norm": float(np.linalg.norm(grads[key])),
                "sampled_norm": float(np.linalg.norm(analytic)),
                "fd_norm": float(np.linalg.norm(check.numeric)),
                "rel_error": check.error,
            }
        )
    return loss, rows


def seq2seq_attention(model: ne.Seq2SeqTransformer, source: list[int]) -> list[tuple]:
    """Panels for plots.plot_attention: encoder self, decoder self and cross, per layer."""
    src = np.array([source])
    generated = greedy_decode(model, src, max_new_tokens=len(source) + 1)[0]
    out_tokens = [int(t) for t in generated if t != PAD]
    decoder_input = np.array([[BOS, *out_tokens[:-1]]]) if out_tokens else np.array([[BOS]])
    _, cache = model.forward(src, decoder_input)
    src_labels = [str(t) for t in source]
    dec_labels = ["BOS", *[str(t) for t in decoder_input[0, 1:]]]
    panels = []
    for i, block in enumerate(cache.encoder.blocks):
        panels.append(
            (f"encoder {i} self", block.attn.attention.weights[0], src_labels, src_labels)
        )
    for i, block in enumerate(cache.decoder.blocks):
        weights = block.self_attn.attention.weights[0]
        panels.append((f"decoder {i} self", weights, dec_labels, dec_labels))
        weights = block.cross_attn.attention.weights[0]
        panels.append((f"decoder {i} cross", weights, src_labels, dec_labels))
    return panels


def gpt_attention(model: ne.MiniGPT, ids: np.ndarray, labels: list[str]) -> list[tuple]:
    _, cache = model.forward(ids[None, -model.config.max_len :])
    labels = labels[-model.config.max_len :]
    return [
        (f"layer {i}", block.attn.attention.weights[0], labels, labels)
        for i, block in enumerate(cache.blocks)
    ]
