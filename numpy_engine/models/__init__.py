"""The model kinds. base.py holds the contract every kind keeps and the registry; each other
module is one kind, registered when this package is imported."""

from numpy_engine.models.base import IGNORE_INDEX, KINDS, Model, model_class, register
from numpy_engine.models.gpt2 import GPT2, GPT2Config
from numpy_engine.models.minigpt import GPTConfig, MiniGPT
from numpy_engine.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer

__all__ = [
    "GPT2",
    "GPT2Config",
    "IGNORE_INDEX",
    "KINDS",
    "GPTConfig",
    "MiniGPT",
    "Model",
    "Seq2SeqConfig",
    "Seq2SeqTransformer",
    "model_class",
    "register",
]
