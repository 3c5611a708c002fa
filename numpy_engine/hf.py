"""Hugging Face GPT-2 directories to engine checkpoints and back (the hf extra).

A directory as `save_pretrained` writes it: config.json, model.safetensors (or, for a model
past its max_shard_size, the shards that model.safetensors.index.json lists) and, when
there is one, tokenizer.json. Hugging Face's Conv1D layers store weights (in, out) and
compute x @ W + b; the engine stores (out, in) as torch.nn.Linear does, so every Conv1D
weight is transposed, and c_attn, which packs q, k and v along its outputs, is split in
three. Only numpy, safetensors and tokenizers are needed: no torch.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np

from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.checks import InputError, check_positive_int
from numpy_engine.dropout import check_rate
from numpy_engine.models import GPT2, GPT2Config
from numpy_engine.tasks import TokenizerCorpus

# engine key under blocks.{i}. -> Hugging Face key under h.{i}., and whether it is a Conv1D
# weight (transposed). c_attn, split into q/k/v, is handled on its own.
LAYER_KEYS = {
    "ln1.weight": ("ln_1.weight", False),
    "ln1.bias": ("ln_1.bias", False),
    "attn.out_proj.weight": ("attn.c_proj.weight", True),
    "attn.out_proj.bias": ("attn.c_proj.bias", False),
    "ln2.weight": ("ln_2.weight", False),
    "ln2.bias": ("ln_2.bias", False),
    "ffn.fc1.weight": ("mlp.c_fc.weight", True),
    "ffn.fc1.bias": ("mlp.c_fc.bias", False),
    "ffn.fc2.weight": ("mlp.c_proj.weight", True),
    "ffn.fc2.bias": ("mlp.c_proj.bias", False),
}
TOP_KEYS = {"tok_embed.weight": "wte.weight", "pos_embed.weight": "wpe.weight"}
TOP_KEYS |= {"final_norm.weight": "ln_f.weight", "final_norm.bias": "ln_f.bias"}
QKV = ("q_proj", "k_proj", "v_proj")  # c_attn's output columns, in that order
BUFFERS = (".attn.bias", ".attn.masked_bias")  # old files' causal-mask buffers, not parameters


# ------------------------------------------------------------------- key mapping


def engine_params_from_hf(state: dict[str, np.ndarray], n_layers: int) -> dict[str, np.ndarray]:
    """Hugging Face GPT-2 tensors (with or without the "transformer." prefix) keyed and laid
    out as the engine's GPT2 params; also maps gradients. Refuses a missing or unexpected key."""
    layout = hf_layout(state, n_layers)
    check_tied_head(state, layout, state.__getitem__)
    return {
        engine: np.ascontiguousarray(laid_out(state[hf], how))
        for engine, (hf, how) in layout.items()
    }


def hf_layout(keys, n_layers: int) -> dict[str, tuple[str, int | str | None]]:
    """Where each of the engine's GPT2 params comes from: its key -> (the Hugging Face key as
    given, with or without "transformer.", and how laid_out lays it out). The mask buffers
    and lm_head.weight (the tied head: check_tied_head) are passed over. Refuses a missing
    or an unexpected key, naming it."""
    given = {}  # the key without its prefix -> the key as given
    for key in keys:
        if not (key.endswith(BUFFERS) or key == "lm_head.weight"):
            given[key.removeprefix("transformer.")] = key
    layout = {}

    def take(engine: str, hf: str, how: int | str | None = None) -> None:
        if hf not in given:
            raise InputError(f"missing key {hf!r}")
        layout[engine] = (given[hf], how)

    for engine, hf in TOP_KEYS.items():
        take(engine, hf)
    for i in range(n_layers):
        for j, name in enumerate(QKV):
            take(f"blocks.{i}.attn.{name}.weight", f"h.{i}.attn.c_attn.weight", j)
            take(f"blocks.{i}.attn.{name}.bias", f"h.{i}.attn.c_attn.bias", j)
        for engine, (hf, conv1d) in LAYER_KEYS.items():
            take(f"blocks.{i}.{engine}", f"h.{i}.{hf}", "T" if conv1d else None)
    unused = set(given.values()) - {hf for hf, _ in layout.values()}
    if unused:
        raise InputError(f"unexpected key {min(unused)!r} (not a GPT-2 parameter)")
    return layout


def laid_out(value: np.ndarray, how: int | str | None) -> np.ndarray:
    """A Hugging Face tensor as the engine lays it out (a view): None as it is; "T" a Conv1D
    weight, (in, out), transposed to (out, in); j the j-th of q, k, v along c_attn's outputs,
    its weight's (C, 3C) or its bias's (3C,), the weight's transposed."""
    if how is None:
        return value
    if how == "T":
        return value.T
    C = value.shape[-1] // 3
    return value[..., how * C : (how + 1) * C].T  # .T of the bias's part: the part itself


def check_tied_head(keys, layout: dict, read) -> None:
    """An lm_head.weight beside wte.weight must be wte (GPT-2 ties its head): read(key)."""
    if "lm_head.weight" in keys:
        if not np.array_equal(read("lm_head.weight"), read(layout["tok_embed.weight"][0])):
            raise InputError("lm_head.weight differs from wte.weight: an untied head")


def hf_state_from_engine(params: dict[str, np.ndarray], n_layers: int) -> dict[str, np.ndarray]:
    """The engine's GPT2 params as GPT2LMHeadModel's state (the head is tied: no lm_head)."""
    state = {f"transformer.{hf}": params[engine] for engine, hf in TOP_KEYS.items()}
    for i in range(n_layers):
        block = f"blocks.{i}.attn."
        weights = [params[f"{block}{name}.weight"] for name in QKV]
        state[f"transformer.h.{i}.attn.c_attn.weight"] = np.concatenate(weights).T
        biases = [params[f"{block}{name}.bias"] for name in QKV]
        state[f"transformer.h.{i}.attn.c_attn.bias"] = np.concatenate(biases)
        for engine, (hf, conv1d) in LAYER_KEYS.items():
            value = params[f"blocks.{i}.{engine}"]
            state[f"transformer.h.{i}.{hf}"] = value.T if conv1d else value
    return {key: np.ascontiguousarray(value) for key, value in state.items()}


# ---------------------------------------------------------------------- configs

# config.json settings whose other values would change the computation
FIXED = {
    "layer_norm_epsilon": 1e-5,
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "add_cross_attention": False,
}


# config.json's dropout rates -> the engine config's (dropout.py); transformers' default 0.1
DROPOUT_RATES = {"embd_pdrop": "embed_dropout", "attn_pdrop": "attn_dropout"}
DROPOUT_RATES |= {"resid_pdrop": "resid_dropout"}
HF_DEFAULT_DROPOUT = 0.1

HF_MODEL_TYPE = "gpt2"  # config.json's model_type: Hugging Face's name for the architecture
REQUIRED = ("vocab_size", "n_embd", "n_head", "n_layer", "n_positions")  # no default here


def config_from_hf(hf: dict, dtype: str) -> GPT2Config:
    if hf.get("model_type") != HF_MODEL_TYPE:
        raise InputError(f"model_type is {hf.get('model_type')!r}; only gpt2 can be imported")
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise InputError(f"activation_function {hf['activation_function']!r}: not the tanh GELU")
    for name, value in FIXED.items():
        if hf.get(name, value) != value:
            raise InputError(f"{name}={hf[name]!r} is not supported (the engine computes {value})")
    if not hf.get("tie_word_embeddings", True):
        raise InputError("tie_word_embeddings is false: the engine's GPT-2 ties its head")
    missing = [name for name in REQUIRED if name not in hf]
    if missing:
        raise InputError(f"config.json has no {', '.join(missing)}")
    for name in REQUIRED:
        check_positive_int(f"config.json's {name}", hf[name])
    if hf.get("n_inner") is not None:  # null or absent: 4 * n_embd
        check_positive_int("config.json's n_inner", hf["n_inner"])
    eos = hf.get("eos_token_id")
    rates = {
        ours: check_rate(theirs, hf.get(theirs, HF_DEFAULT_DROPOUT))
        for theirs, ours in DROPOUT_RATES.items()
    }
    return GPT2Config(
        vocab_size=hf["vocab_size"],
        d_model=hf["n_embd"],
        n_heads=hf["n_head"],
        d_ff=hf.get("n_inner") or 4 * hf["n_embd"],
        n_layers=hf["n_layer"],
        max_len=hf["n_positions"],
        dtype=dtype,
        eos_id=eos if isinstance(eos, int) and 0 <= eos < hf["vocab_size"] else None,
        **rates,
    )


def hf_config_from_engine(cfg: GPT2Config) -> dict:
    eos = cfg.eos_id  # None: no end-of-text token (transformers accepts None, not out-of-range)
    return {
        "model_type": HF_MODEL_TYPE,
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": cfg.vocab_size,
        "n_embd": cfg.d_model,
        "n_head": cfg.n_heads,
        "n_inner": cfg.d_ff,
        "n_layer": cfg.n_layers,
        "n_positions": cfg.max_len,
        "activation_function": "gelu_new",
        "bos_token_id": eos,
        "eos_token_id": eos,
        "tie_word_embeddings": True,
        "dtype": cfg.dtype,
        **{theirs: getattr(cfg, ours) for theirs, ours in DROPOUT_RATES.items()},
        **FIXED,
    }


# ------------------------------------------------------------------- the commands


def _safetensors():
    try:
        import safetensors
        import safetensors.numpy
    except ImportError:
        raise InputError("this needs the hf extra: pip install -e '.[hf]'") from None
    return safetensors


def import_hf(directory: str | Path, out: str | Path) -> Path:
    """A Hugging Face GPT-2 directory as an engine checkpoint in out (its tokenizer too)."""
    directory = Path(directory)
    st = _safetensors()
    if not directory.is_dir():
        what = "a file, not a directory" if directory.exists() else "no such directory"
        raise InputError(f"{directory}: {what} (import-hf reads a Hugging Face model's directory)")
    hf_config = _read_json(directory / "config.json")
    with _open_weights(st, directory) as tensors:
        float64 = any(tensors.dtype(key) == "F64" for key in tensors.keys())
        config = config_from_hf(hf_config, "float64" if float64 else "float32")
        layout = hf_layout(tensors.keys(), config.n_layers)
        check_tied_head(tensors.keys(), layout, tensors.read)
        model = GPT2.unwritten(config)  # then its weights one at a time, each read when written
        model.read_params(layout, lambda key: _engine_param(tensors, *layout[key], config.dtype))
    meta = {"task": "import-hf", "source": str(directory)}
    tokenizer = directory / "tokenizer.json"
    if tokenizer.is_file():
        meta["tokenizer"] = _read_tokenizer(tokenizer, config.vocab_size)
    return save_checkpoint(out, model, None, meta)


def _engine_param(tensors: TensorFiles, hf: str, how, dtype: str) -> np.ndarray:
    return laid_out(tensors.read(hf), how).astype(dtype, copy=False)  # float32 stays a view


class TensorFiles:
    """The tensors of safetensors files by key, each read from its file only when asked for:
    an import holds the model and one tensor at a time (the largest, gpt2's wte: 154 MB),
    not every tensor besides. Read by pread, not through a map of the file, whose pages
    would count towards the process's memory as they were read. A context manager: its
    exit closes the files."""

    def __init__(self, st) -> None:
        self.st, self.files = st, contextlib.ExitStack()
        self.where: dict[str, tuple] = {}  # key -> (its file's handle, the file's path)

    def add(self, path: Path) -> set[str]:
        """Open a file (refused by name if it is no safetensors file); returns its keys."""
        if not path.is_file():
            raise InputError(f"{path}: no such file (import-hf reads safetensors)")
        try:
            handle = self.files.enter_context(_safe_open(self.st, path))
            keys = set(handle.keys())
        except Exception as error:  # safetensors raises its own error types for a corrupt file
            raise InputError(f"{path}: not a readable safetensors file ({error})") from None
        twice = keys & self.where.keys()  # which copy is the weight? neither is chosen
        if twice:
            key = min(twice)
            raise InputError(f"{path}: holds {key!r}, which {self.where[key][1]} holds too")
        self.where |= dict.fromkeys(keys, (handle, path))
        return keys

    def keys(self):
        return self.where.keys()

    def dtype(self, key: str) -> str:
        """safetensors' name of the tensor's dtype ("F32", "F64", ...), from its file's header."""
        return self.where[key][0].get_slice(key).get_dtype()

    def read(self, key: str) -> np.ndarray:
        handle, path = self.where[key]
        try:
            return handle.get_tensor(key)
        except Exception as error:  # a dtype NumPy has not (bfloat16), a file cut short
            raise InputError(f"{path}: tensor {key!r} is not readable ({error})") from None

    def __enter__(self) -> TensorFiles:
        return self

    def __exit__(self, *exc) -> None:
        self.files.close()


def _safe_open(st, path: Path):
    try:
        return st.safe_open(path, framework="numpy", backend="pread")
    except TypeError:  # safetensors before 0.8 has no backend: it maps the file (more memory)
        return st.safe_open(path, framework="numpy")


SINGLE_FILE = "model.safetensors"  # save_pretrained's weights of a model below max_shard_size
SHARD_INDEX = "model.safetensors.index.json"  # save_pretrained's list of a sharded model's files


def _open_weights(st, directory: Path) -> TensorFiles:
    """The directory's model.safetensors, or the shards its index lists, opened."""
    single, index = directory / SINGLE_FILE, directory / SHARD_INDEX
    tensors = TensorFiles(st)
    with contextlib.ExitStack() as unless_opened:  # closes the files opened if one is refused
        unless_opened.push(tensors)
        if single.is_file():
            tensors.add(single)
        elif index.is_file():
            _open_shards(tensors, index)
        else:
            _refuse_missing_weights(directory)
        unless_opened.pop_all()
    return tensors


def _refuse_missing_weights(directory: Path) -> None:
    single = directory / SINGLE_FILE
    pickled = sorted(path.name for path in directory.glob("pytorch_model*.bin"))
    if pickled:  # torch's pickles: reading them would need torch, and trusting the file
        raise InputError(
            f"{single}: no such file, nor {SHARD_INDEX}; {pickled[0]} is torch's format: load "
            "it with transformers and save_pretrained it again, which writes safetensors"
        )
    raise InputError(f"{single}: no such file, nor {SHARD_INDEX} (import-hf reads safetensors)")


def _open_shards(tensors: TensorFiles, index: Path) -> None:
    """Every shard the index lists, each checked to hold the keys listed for it and no key
    that another shard holds (TensorFiles.add)."""
    weight_map = _read_json(index).get("weight_map")  # key -> the shard's file name
    if not isinstance(weight_map, dict) or not weight_map:
        raise InputError(f"{index}: no weight_map naming each key's shard")
    for name in sorted(set(map(str, weight_map.values()))):
        if Path(name).name != name:  # a shard lies beside its index, never elsewhere
            raise InputError(f"{index}: shard {name!r} is not a file name in {index.parent}")
        keys = tensors.add(index.parent / name)
        lacking = {key for key, file in weight_map.items() if file == name} - keys
        if lacking:
            raise InputError(f"{index.parent / name}: lacks {min(lacking)!r}")


def _read_tokenizer(path: Path, vocab_size: int) -> str:
    """tokenizer.json's text, once the tokenizers library has read it and its ids fit the
    model's vocabulary (a larger one would encode text into ids the model has no row for)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as error:  # UnicodeDecodeError is a ValueError
        raise InputError(f"{path}: not readable ({error})") from None
    ids = TokenizerCorpus(text, where=str(path)).vocab_size
    if ids > vocab_size:
        raise InputError(f"{path}: {ids} tokens, more than the model's vocab_size {vocab_size}")
    return text


HF_FILES = ("config.json", "model.safetensors", "tokenizer.json")  # what export_hf writes


def export_hf(checkpoint_path: str | Path, to: str | Path) -> Path:
    """An engine GPT-2 checkpoint as a directory GPT2LMHeadModel.from_pretrained loads."""
    st = _safetensors().numpy
    checkpoint = load_checkpoint(checkpoint_path, optimizer=False)
    model = checkpoint.model
    if model.kind != GPT2.kind:
        held = f"a {type(model).__name__} (kind {model.kind!r})"  # "a MiniGPT (kind 'gpt')"
        other = ", which `numpy-engine export` writes as a PyTorch state_dict"
        raise InputError(
            f"export-hf writes GPT-2 models (kind {GPT2.kind!r}); this checkpoint holds {held}"
            + (other if model.torch_twin else "")
        )
    to = Path(to)
    to.mkdir(parents=True, exist_ok=True)
    state = hf_state_from_engine(model.params, model.config.n_layers)
    st.save_file(state, to / SINGLE_FILE, metadata={"format": "pt"})
    config = json.dumps(hf_config_from_engine(model.config), indent=2)
    (to / "config.json").write_text(config + "\n")
    if "tokenizer" in checkpoint.meta:
        (to / "tokenizer.json").write_text(checkpoint.meta["tokenizer"], encoding="utf-8")
    return to


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(value, dict):
        raise InputError(f"{path}: a JSON {type(value).__name__}, not an object of settings")
    return value
