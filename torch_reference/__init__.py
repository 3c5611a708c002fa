"""The same transformers as numpy_engine, in PyTorch autograd, with the same parameter names.

Written independently of the engine: no engine code runs inside these forwards.
Only torch_reference.convert imports numpy_engine, to move weights across.
"""

from torch_reference.models import MiniGPT, Seq2SeqTransformer

__all__ = ["MiniGPT", "Seq2SeqTransformer"]
