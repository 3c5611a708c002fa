"""import-hf of a sharded directory (model.safetensors.index.json and its shards, as
save_pretrained writes a model past its max_shard_size): the same weights as the whole file,
and each index or shard that does not match refused by name, with its files closed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from transformers import GPT2LMHeadModel

from numpy_engine import hf
from numpy_engine.checkpoint import load_checkpoint
from parity_tests.hf_cases import cli


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory, hf_dir):
    """hf_dir as save_pretrained writes a model past its max_shard_size: no model.safetensors,
    but shards and model.safetensors.index.json, which names each key's shard."""
    directory = tmp_path_factory.mktemp("sharded")
    GPT2LMHeadModel.from_pretrained(hf_dir).save_pretrained(directory, max_shard_size="8KB")
    shutil.copy(hf_dir / "tokenizer.json", directory)
    return directory


def test_import_reads_a_sharded_directory_as_the_whole_one(tmp_path, capsys, hf_dir, sharded_dir):
    assert not (sharded_dir / "model.safetensors").exists() and len(shard_names(sharded_dir)) >= 3
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert cli(capsys, "import-hf", str(hf_dir), "--out", str(whole))[0] == 0
    assert cli(capsys, "import-hf", str(sharded_dir), "--out", str(parts))[0] == 0
    whole_params, parts_params = (load_checkpoint(run).model.params for run in (whole, parts))
    assert list(whole_params) == list(parts_params)
    for key, value in whole_params.items():
        np.testing.assert_array_equal(parts_params[key], value)


def shard_names(directory: Path) -> list[str]:
    """The files a sharded directory's index names, in order."""
    index = json.loads((directory / hf.SHARD_INDEX).read_text())
    return sorted(set(index["weight_map"].values()))


def first_shard(directory: Path) -> Path:
    return directory / shard_names(directory)[0]


def spoil_index(change):
    def spoil(directory):
        index = json.loads((directory / hf.SHARD_INDEX).read_text())
        (directory / hf.SHARD_INDEX).write_text(json.dumps(change(index)))

    return spoil


def first_shard_holds_a_key_of_the_second(directory: Path) -> None:
    """The second shard's largest key, not its smallest: the refusal names the key held twice."""
    first, second = (directory / name for name in shard_names(directory)[:2])
    from_second = load_file(second)
    key = max(from_second)
    save_file(load_file(first) | {key: from_second[key] + 1}, first)


def listed_in_first_shard(index: dict) -> dict:
    shard = min(index["weight_map"].values())
    return index | {"weight_map": index["weight_map"] | {"transformer.h.9.extra": shard}}


@pytest.mark.parametrize(
    ("spoil", "words"),
    [
        (lambda d: first_shard(d).unlink(), "{first}: no such file (import-hf reads"),
        (lambda d: first_shard(d).write_bytes(b"\x00" * 9), "{first}: not a readable safetensors"),
        (spoil_index(lambda index: {"metadata": {}}), "no weight_map naming each key's shard"),
        (spoil_index(lambda index: {"weight_map": {}}), "no weight_map naming each key's shard"),
        (
            spoil_index(lambda index: index | {"weight_map": {"wte": "../model.safetensors"}}),
            "shard '../model.safetensors' is not a file name in",
        ),
        (spoil_index(listed_in_first_shard), "lacks 'transformer.h.9.extra'"),
        (first_shard_holds_a_key_of_the_second, "{second}: holds '{key}', which {first} holds too"),
        (
            lambda d: (d / hf.SHARD_INDEX).unlink(),
            "{directory}/model.safetensors: no such file, nor model.safetensors.index",
        ),
    ],
)
def test_import_refuses_a_sharded_directory_whose_shards_do_not_match_its_index(
    tmp_path, capsys, sharded_dir, spoil, words
):
    """Each refusal is one line naming the file ({first}: the index's first shard)."""
    directory = tmp_path / "spoiled"
    shutil.copytree(sharded_dir, directory)
    first, second = (directory / name for name in shard_names(directory)[:2])
    key = max(load_file(second))
    words = words.format(first=first, second=second, key=key, directory=directory)
    spoil(directory)
    status, _, err = cli(capsys, "import-hf", str(directory), "--out", str(tmp_path / "run"))
    assert status == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_a_refused_import_closes_the_files_it_opened(tmp_path, sharded_dir):
    """An import refused at a shard (here its index lists a key the first shard lacks) has
    closed the shards it opened when it raises, not later, when its frames are let go of
    (the refusal's traceback holds them here)."""
    directory = tmp_path / "spoiled"
    shutil.copytree(sharded_dir, directory)
    spoil_index(listed_in_first_shard)(directory)
    with pytest.raises(ValueError, match="lacks 'transformer.h.9.extra'") as refused:
        hf.import_hf(directory, tmp_path / "run")
    assert refused.tb is not None and files_open_in(directory) == []  # its frames still held
    assert files_open_in(sharded_dir) == []  # the import that reads it, after it returns
    hf.import_hf(sharded_dir, tmp_path / "run")
    assert files_open_in(sharded_dir) == []


def files_open_in(directory: Path) -> list[str]:
    """The files under directory this process holds open (Linux: /proc/self/fd)."""
    targets = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            targets.append(os.readlink(fd))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return [target for target in targets if target.startswith(str(directory))]
