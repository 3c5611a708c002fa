"""numpy-engine: a transformer in pure NumPy whose every backward pass is written by hand.

import numpy_engine as ne
model = ne.Seq2SeqTransformer(ne.Seq2SeqConfig(dtype="float64"), seed=0)
loss, grads = model.loss_and_grads(source, decoder_input, target)
"""

from numpy_engine.models import GPTConfig, MiniGPT, Model, Seq2SeqConfig, Seq2SeqTransformer

__all__ = ["GPTConfig", "MiniGPT", "Model", "Seq2SeqConfig", "Seq2SeqTransformer"]
__version__ = "0.1.0"
