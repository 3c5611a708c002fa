"""Checkpoints: params, config, optimizer state and metadata in one .npz, never pickled.

Layout of the archive (all plain arrays; strings are unicode arrays):
  format_version   int, checked on load
  kind             the registered model kind ("seq2seq", "gpt", ...; numpy_engine/models)
  config           the model config as JSON
  meta             anything JSON-able (task, vocabulary, step, ...) as JSON
  param/<key>      each parameter, keyed like model.params
  optim/<key>      the optimizer's state_dict(), if one was saved
Writes go to a temporary file in the same directory, are flushed to disk, and then
replace the old file in one step, so a crash leaves the old checkpoint or the new one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from numpy_engine.checks import InputError
from numpy_engine.models import KINDS, Model

FORMAT_VERSION = 1
FILENAME = "checkpoint.npz"


@dataclass
class Checkpoint:
    model: Model
    optimizer_state: dict[str, np.ndarray] | None  # empty when none was saved; None: not read
    meta: dict


def resolve(path: str | Path) -> Path:
    """A path ending in .npz is the file itself; any other path is a directory holding it."""
    path = Path(path)
    return path if path.suffix == ".npz" else path / FILENAME


def save_checkpoint(
    path: str | Path, model, optimizer_state: dict | None = None, meta: dict | None = None
) -> Path:
    """Write atomically; returns the file written."""
    path = resolve(path)
    arrays = {
        "format_version": np.array(FORMAT_VERSION),
        "kind": np.array(model.kind),
        "config": np.array(json.dumps(dataclasses.asdict(model.config))),
        "meta": np.array(json.dumps(meta or {})),
    }
    arrays.update({f"param/{key}": value for key, value in model.params.items()})
    arrays.update({f"optim/{key}": value for key, value in (optimizer_state or {}).items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as tmp:
            np.savez(tmp, **arrays)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp makes it private; a checkpoint is a shared artifact
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


HEADER = ("format_version", "kind", "config", "meta")  # the archive's entries that are not arrays
PARTS = ("param/", "optim/")  # the prefixes of those that are


def load_checkpoint(path: str | Path, optimizer: bool = True) -> Checkpoint:
    """The checkpoint in a run directory or .npz file. Its weights are read into the model one
    at a time (Model.read_params): the read's peak is the model and its largest weight.
    optimizer=False leaves the optimizer's state unread (optimizer_state None): all but
    resuming need only the weights, and a fine-tuned GPT-2's moments are 950 MB more."""
    with _opened(path) as (path, archive):
        return _from_archive(path, archive, optimizer)


@contextlib.contextmanager
def _opened(path: str | Path) -> Iterator[tuple[Path, np.lib.npyio.NpzFile]]:
    """(the checkpoint file path names, that file open as an .npz archive), each refused by
    name: a missing file, or one that is no zip (_check_is_a_zip). Closed on leaving."""
    path = _existing(path)
    _check_is_a_zip(path)
    with open(path, "rb") as file:  # our own handle: closed on error
        archive = _read(path, lambda: np.load(file, allow_pickle=False))
        with archive:
            yield path, archive


@dataclass
class Contents:
    """What a checkpoint holds, as read_contents finds it without reading a weight."""

    path: Path
    model_class: type
    config: object
    meta: dict
    params: dict[str, tuple[tuple, np.dtype]]  # each parameter's (shape, dtype)
    optimizer_arrays: int  # the optimizer state's arrays; 0: none saved


def read_contents(path: str | Path) -> Contents:
    """A checkpoint's header and the shape and dtype of each array, read from the arrays'
    own .npy headers: no array is read (a 124M GPT-2's checkpoint is ~500 MB)."""
    with _opened(path) as (path, archive):
        model_class, config, meta = _header_of(path, archive)
        shapes = _array_headers(path, archive.zip)
    pickled = [name for name, (_, dtype) in shapes.items() if dtype.hasobject]
    if pickled:  # never read here, but never to be read: load_checkpoint refuses them
        raise UnreadableCheckpoint(
            f"checkpoint {path}: refused, it holds pickled objects ({pickled[0]})"
        )
    params = {key: shapes[f"param/{key}"] for key in _under("param/", list(shapes))}
    optimizer_arrays = len(_under("optim/", list(shapes)))
    return Contents(path, model_class, config, meta, params, optimizer_arrays)


def read_header(path: str | Path) -> tuple:
    """(the model's class, its config, the meta) of a checkpoint, from its header alone. Its
    arrays are not looked at, so a pickled optimizer moment, which read_contents refuses and
    train --init never reads, is not seen here either."""
    with _opened(path) as (path, archive):
        return _header_of(path, archive)


def _header_of(path: Path, archive) -> tuple:
    header = _read(path, lambda: {key: archive[key] for key in HEADER if key in archive})
    return _from_header(path, header)


def _array_headers(path: Path, archive: zipfile.ZipFile) -> dict[str, tuple[tuple, np.dtype]]:
    """(shape, dtype) of each array in an .npz, read from the start of its .npy member."""
    headers = {}
    for name in archive.namelist():
        try:
            with archive.open(name) as member:
                version = np.lib.format.read_magic(member)
                read = {(1, 0): np.lib.format.read_array_header_1_0}.get(
                    version,
                    np.lib.format.read_array_header_2_0,  # past 64 KiB of header
                )
                shape, _, dtype = read(member)
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as error:
            message = f"checkpoint {path}: {name} is not a readable array ({error})"
            raise UnreadableCheckpoint(message) from None
        headers[name.removesuffix(".npy")] = (shape, dtype)
    return headers


def _existing(path: str | Path) -> Path:
    """The checkpoint file path names (resolve), refused by name if there is none."""
    given, path = Path(path), resolve(path)
    if not path.exists():
        if given.is_file():  # resolve read it as a run directory
            raise InputError(
                f"checkpoint {given}: a file, not a run directory; a checkpoint is a run "
                "directory or a file ending in .npz"
            )
        if (given / "model.safetensors").is_file():
            raise InputError(
                f"checkpoint {path}: no such file; {given} is a Hugging Face directory: turn "
                f"it into a checkpoint with numpy-engine import-hf {given} --out RUN"
            )
        raise InputError(f"checkpoint {path}: no such file")
    return path


def _from_archive(path: Path, archive, optimizer: bool) -> Checkpoint:
    """The model made from the header, then its weights read into it one at a time
    (Model.read_params), then the optimizer's state if asked for."""
    unknown = [key for key in archive.files if key not in HEADER and not key.startswith(PARTS)]
    if unknown:
        raise InputError(f"checkpoint {path}: an entry {unknown[0]!r} that is no part of one")
    header = _read(path, lambda: {key: archive[key] for key in HEADER if key in archive})
    model_class, config, meta = _from_header(path, header)
    try:
        model = model_class.unwritten(config)
    except MemoryError:
        message = f"checkpoint {path}: its model does not fit in memory ({config})"
        raise InputError(message) from None

    def weight(key: str) -> np.ndarray:
        return _read(path, lambda: archive[f"param/{key}"])

    _fitted(path, lambda: model.read_params(_under("param/", archive.files), weight))
    if not optimizer:
        return Checkpoint(model, None, meta)
    optim = _under("optim/", archive.files)
    optimizer_state = _read(path, lambda: {key: archive[f"optim/{key}"] for key in optim})
    return Checkpoint(model, optimizer_state, meta)


class UnreadableCheckpoint(InputError):
    """A checkpoint file that could not be read (not one whose weights do not fit its model)."""


def _read(path: Path, read):
    """read(), its errors as UnreadableCheckpoint naming the checkpoint."""
    try:
        return read()
    except ValueError as error:
        if "allow_pickle" in str(error):  # numpy refuses object arrays without allow_pickle
            what = "refused, it holds pickled objects"
        else:  # an entry that is no .npy array (its magic string, its header)
            what = "not a readable .npz file"
        raise UnreadableCheckpoint(f"checkpoint {path}: {what} ({error})") from None
    except (OSError, zipfile.BadZipFile, EOFError) as error:
        raise UnreadableCheckpoint(
            f"checkpoint {path}: not a readable .npz file ({error})"
        ) from None


def _fitted(path: Path, fit) -> None:
    """fit() (the checkpoint's weights read into its model), a weight that does not fit the
    model as InputError naming the checkpoint; a weight that could not be read as it is."""
    try:
        fit()
    except UnreadableCheckpoint:
        raise
    except (ValueError, TypeError) as error:
        raise InputError(f"checkpoint {path}: does not match its config: {error}") from None


def _under(prefix: str, keys: list[str]) -> list[str]:
    """The keys that start with prefix, without it."""
    return [key.removeprefix(prefix) for key in keys if key.startswith(prefix)]


_ZIP_STARTS = (b"PK\x03\x04", b"PK\x05\x06")  # a zip's first entry, or an empty zip


def _check_is_a_zip(path: Path) -> None:
    """An .npz is a zip. np.load reads any other file as a single .npy array or, failing
    that, as a pickle: a text file or a picture would be refused as "pickled", and a .npy
    array would come back as an array instead of an archive."""
    with open(path, "rb") as file:
        start = file.read(8)
    if start.startswith(_ZIP_STARTS):
        return
    if not start:
        raise InputError(f"checkpoint {path}: an empty file")
    if start.startswith(b"\x93NUMPY"):
        raise InputError(f"checkpoint {path}: a single .npy array, not an .npz checkpoint")
    if start[:1] == b"\x80" and start[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        raise InputError(f"checkpoint {path}: refused, it holds pickled objects (a pickle)")
    raise InputError(f"checkpoint {path}: not an .npz file (it starts with {start!r})")


def _from_header(path: Path, header: dict) -> tuple:
    """(the model's class, its config, the meta) from the archive's HEADER entries."""
    for required in HEADER:
        if required not in header:
            raise InputError(f"checkpoint {path}: missing {required!r}")
    version = int(header["format_version"])
    if version != FORMAT_VERSION:
        raise InputError(f"checkpoint {path}: format version {version}, expected {FORMAT_VERSION}")
    kind = str(header["kind"])
    if kind not in KINDS:
        raise InputError(f"checkpoint {path}: unknown model kind {kind!r}")
    model_class = KINDS[kind]
    try:
        config = model_class.config_class(**json.loads(str(header["config"])))
        meta = json.loads(str(header["meta"]))
    except (TypeError, ValueError) as error:  # JSONDecodeError is a ValueError
        raise InputError(f"checkpoint {path}: unreadable config or meta ({error})") from None
    if not isinstance(meta, dict):  # what a run, an import or a user wrote: read by its keys
        raise InputError(
            f"checkpoint {path}: its meta is a JSON {type(meta).__name__}, not an object"
        )
    return model_class, config, meta
