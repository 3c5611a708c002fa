"""The same transformers as numpy_engine, in PyTorch autograd, with the same parameter names.

Written independently of the engine: nothing here imports numpy_engine (a static test
checks it), so no engine code runs inside these forwards. crosscheck/ moves weights across.
"""

from torch_reference.models import MiniGPT, Seq2SeqTransformer

__all__ = ["MiniGPT", "Seq2SeqTransformer"]
