"""A random transformers GPT-2 with a trained byte-level BPE tokenizer, saved as
save_pretrained writes it, goes through the command line: import-hf, generate (the same
tokens as transformers' greedy generate), train lm --init (the loss falls) and --resume,
export-hf back into from_pretrained. And each malformed directory is refused by name."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel

from numpy_engine import cli_hf, hf
from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.cli import main
from numpy_engine.tasks import DEFAULT_TEXT, TextSoFar, TokenizerCorpus

EOT = "<|endoftext|>"


def bpe_tokenizer(text: str) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([text], trainer)
    return tokenizer


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return save_random_gpt2(tmp_path_factory.mktemp("hf"))


def save_random_gpt2(directory: Path) -> Path:
    """A random 2-layer transformers GPT-2 and its BPE tokenizer, written into directory."""
    tokenizer = bpe_tokenizer(DEFAULT_TEXT)
    eot = tokenizer.token_to_id(EOT)
    config = GPT2Config(
        vocab_size=tokenizer.get_vocab_size(),
        n_positions=32,
        n_embd=16,
        n_layer=2,
        n_head=2,
        bos_token_id=eot,
        eos_token_id=eot,
    )
    torch.manual_seed(0)
    GPT2LMHeadModel(config).eval().save_pretrained(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_import_generate_finetune_resume_export(tmp_path, capsys, hf_dir):
    run, tuned, back = tmp_path / "run", tmp_path / "tuned", tmp_path / "back"
    assert cli(capsys, "import-hf", str(hf_dir), "--out", str(run)) == (
        0,
        f"wrote {run / 'checkpoint.npz'}\n",
        "",
    )
    assert load_checkpoint(run).meta["source"] == str(hf_dir)  # where it came from

    generate = ["generate", "--checkpoint", str(run), "--prompt", "to be", "--max-new-tokens"]
    status, out, _ = cli(capsys, *generate, "20")
    assert status == 0
    tokenizer = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    hf = GPT2LMHeadModel.from_pretrained(hf_dir).eval()
    prompt = torch.tensor([tokenizer.encode("to be").ids])
    eot = tokenizer.token_to_id(EOT)
    expected = hf.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=eot)
    assert out.rstrip("\n") == tokenizer.decode(expected[0].tolist(), skip_special_tokens=False)
    assert expected.shape[1] > prompt.shape[1] + 5  # it generated, not stopped at once

    text = tmp_path / "text.txt"
    text.write_text(DEFAULT_TEXT)
    args = ["--text", str(text), "--context", "16", "--batch-size", "4", "--lr", "3e-3"]
    args += ["--holdout", "0.25", "--eval-every", "10"]  # the text's last quarter held out
    assert (
        cli(
            capsys,
            "train",
            "lm",
            "--init",
            str(run),
            *args,
            "--steps",
            "20",
            "--quiet",
            "--out",
            str(tuned),
        )[0]
        == 0
    )
    assert cli(capsys, "train", "--resume", str(tuned), "--steps", "30", "--quiet")[0] == 0
    result = json.loads((tuned / "result.json").read_text())
    assert result["steps"] == 30 and result["task"] == "lm"
    assert result["final_train_loss"] < result["initial_train_loss"] - 1.0
    evaluations = json.loads((tuned / "history.json").read_text())["eval"]
    assert [e["step"] for e in evaluations] == [10, 20, 30]  # 20 steps, then resumed to 30
    assert (
        result["heldout_loss"] == evaluations[-1]["heldout_loss"] < evaluations[0]["heldout_loss"]
    )

    exported = cli(capsys, "export-hf", "--checkpoint", str(tuned), "--to", str(back))
    assert exported == (0, f"wrote {back}\n", "")
    reloaded, info = GPT2LMHeadModel.from_pretrained(back, output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    ids = np.array([tokenizer.encode("that is the question").ids])
    ours, _ = load_checkpoint(tuned).model.forward(ids)
    theirs = reloaded.eval()(torch.tensor(ids)).logits.detach().numpy()
    assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()
    assert (back / "tokenizer.json").read_text() == (hf_dir / "tokenizer.json").read_text()
    assert json.loads((back / "config.json").read_text())["eos_token_id"] == eot
    # transformers' default dropout, 0.1 at each site: imported, fine-tuned with, written back
    config = load_checkpoint(tuned).model.config
    assert (config.embed_dropout, config.attn_dropout, config.resid_dropout) == (0.1,) * 3
    pdrop = (reloaded.config.embd_pdrop, reloaded.config.attn_pdrop, reloaded.config.resid_pdrop)
    assert pdrop == (0.1,) * 3


def spoiled(tmp_path, hf_dir, config=None, state=None):
    """A copy of hf_dir with config.json and the weights changed as given."""
    out = tmp_path / "spoiled"
    out.mkdir()
    hf_config = json.loads((hf_dir / "config.json").read_text()) | (config or {})
    (out / "config.json").write_text(json.dumps(hf_config))
    weights = load_file(hf_dir / "model.safetensors")
    save_file(state(weights) if state else weights, out / "model.safetensors")
    return out


def without(key):
    return lambda weights: {k: v for k, v in weights.items() if k != key}


def reshaped(key):
    return lambda weights: weights | {key: weights[key][:-1]}


@pytest.mark.parametrize(
    ("config", "state", "words"),
    [
        ({"model_type": "bert"}, None, "model_type is 'bert'; only gpt2"),
        (None, without("transformer.h.1.mlp.c_fc.bias"), "missing key 'h.1.mlp.c_fc.bias'"),
        (
            None,
            lambda w: w | {"transformer.h.0.extra": w["transformer.ln_f.bias"]},
            "unexpected key 'transformer.h.0.extra' (not a GPT-2 parameter)",
        ),
        (
            None,
            lambda w: w | {"transformer.lm_head.weight": w["transformer.wte.weight"]},
            "unexpected key 'transformer.lm_head.weight'",  # a head is never under transformer.
        ),
        (None, reshaped("transformer.ln_f.bias"), "final_norm.bias'] must have shape (16,)"),
        ({"layer_norm_epsilon": 1e-6}, None, "layer_norm_epsilon=1e-06 is not supported"),
        (
            None,
            lambda w: w | {"lm_head.weight": 2 * w["transformer.wte.weight"]},
            "lm_head.weight differs from wte.weight: an untied head",
        ),
    ],
)
def test_import_refuses_a_malformed_directory(tmp_path, capsys, hf_dir, config, state, words):
    directory = spoiled(tmp_path, hf_dir, config, state)
    status, _, err = cli(capsys, "import-hf", str(directory), "--out", str(tmp_path / "run"))
    assert status == 2 and words in err, err
    assert not (tmp_path / "run" / "checkpoint.npz").exists()


def _no_n_embd(directory):
    config = json.loads((directory / "config.json").read_text())
    del config["n_embd"]
    (directory / "config.json").write_text(json.dumps(config))


def _tokenizer_larger_than_the_model(directory):
    tokenizer = bpe_tokenizer(DEFAULT_TEXT + "".join(map(chr, range(0x400, 0x500))))
    tokenizer.save(str(directory / "tokenizer.json"))


@pytest.mark.parametrize(
    ("spoil", "words"),
    [
        (lambda d: (d / "config.json").write_text("[1, 2]"), "a JSON list, not an object"),
        (_no_n_embd, "config.json has no n_embd"),
        (
            lambda d: (d / "tokenizer.json").write_text("garbage"),
            "tokenizer.json: not a readable tokenizer",
        ),
        (lambda d: (d / "tokenizer.json").write_bytes(b"\xff{}"), "tokenizer.json: not readable"),
        (_tokenizer_larger_than_the_model, "tokens, more than the model's vocab_size"),
    ],
    ids=[
        "config-a-list",
        "config-without-n_embd",
        "tokenizer-garbage",
        "tokenizer-not-utf8",
        "tokenizer-too-large",
    ],
)
def test_import_refuses_a_malformed_config_or_tokenizer(tmp_path, capsys, hf_dir, spoil, words):
    """Each was a traceback (exit 1), or for a malformed tokenizer an import that worked
    and a generate that crashed: now one line naming the file, exit 2, nothing written."""
    directory = tmp_path / "spoiled"
    shutil.copytree(hf_dir, directory)
    spoil(directory)
    status, _, err = cli(capsys, "import-hf", str(directory), "--out", str(tmp_path / "run"))
    assert status == 2 and words in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_whose_tokenizer_is_spoiled_is_refused_by_name(tmp_path, capsys, hf_dir):
    run = tmp_path / "run"
    assert cli(capsys, "import-hf", str(hf_dir), "--out", str(run))[0] == 0
    checkpoint = load_checkpoint(run)
    meta = checkpoint.meta | {"tokenizer": "{"}
    save_checkpoint(run / "spoiled.npz", checkpoint.model, None, meta)
    status, _, err = cli(
        capsys, "generate", "--checkpoint", str(run / "spoiled.npz"), "--prompt", "to"
    )
    assert status == 2 and "the checkpoint's tokenizer: not a readable tokenizer" in err, err


def test_a_model_imported_without_its_tokenizer_says_how_to_read_text(tmp_path, capsys, hf_dir):
    """spoiled() copies config.json and the weights, not tokenizer.json: the import works and
    says so, and reading text says where the tokenizer must be, with exit 2."""
    run, text = tmp_path / "run", tmp_path / "text.txt"
    text.write_text(DEFAULT_TEXT)
    status, _, err = cli(capsys, "import-hf", str(spoiled(tmp_path, hf_dir)), "--out", str(run))
    assert status == 0 and "has no tokenizer.json, so the checkpoint reads no text" in err
    for command in (
        ("generate", "--checkpoint", str(run), "--prompt", "to be"),
        ("train", "lm", "--init", str(run), "--text", str(text), "--steps", "1"),
    ):
        status, _, err = cli(capsys, *command)
        assert status == 2 and "no tokenizer or vocabulary" in err and "tokenizer.json" in err


def test_a_directory_with_vocab_and_merges_is_told_the_line_that_writes_tokenizer_json(
    tmp_path, capsys, hf_dir
):
    """The older files a tokenizer saved without tokenizer.json (vocab.json, merges.txt): the
    import's note gives the transformers line that writes tokenizer.json from them. Run as
    given (its Python, in this process), then imported again, the checkpoint's tokenizer
    gives the ids of the tokenizer the two files were saved from, and generate reads text."""
    directory = spoiled(tmp_path, hf_dir)
    original = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    original.model.save(str(directory))  # vocab.json and merges.txt
    status, _, err = cli(capsys, "import-hf", str(directory), "--out", str(tmp_path / "no"))
    assert status == 0 and "It has vocab.json and merges.txt" in err, err
    line = next(line.strip() for line in err.splitlines() if line.strip().startswith("python"))
    program, flag, code = shlex.split(line)
    assert (program, flag) == ("python", "-c")
    exec(code, {})  # noqa: S102 - the note's own line, as a shell would run it
    run = tmp_path / "run"
    status, _, err = cli(capsys, "import-hf", str(directory), "--out", str(run))
    assert status == 0 and "note:" not in err, err
    corpus = TokenizerCorpus(load_checkpoint(run).meta["tokenizer"])
    text = "to be, or not to be: that is the question<|endoftext|> Whether 'tis"
    assert corpus.encode(text).tolist() == original.encode(text).ids
    assert cli(capsys, "generate", "--checkpoint", str(run), "--prompt", "to be")[0] == 0


def test_the_tokenizer_line_quotes_any_directory_name():
    """A directory named with quotes and spaces reaches Python as it is."""
    for name in ("/tmp/it's here", 'a "b" c', "plain"):
        program, flag, code = shlex.split(cli_hf.tokenizer_json_command(name))
        assert (program, flag) == ("python", "-c") and code.startswith(f"d = {json.dumps(name)};")
        scope: dict = {}
        exec(code.split(";")[0], scope)  # noqa: S102 - the assignment alone
        assert scope["d"] == name


def test_fine_tuning_a_model_wider_than_its_tokenizer_reports_both_sizes(tmp_path, capsys, hf_dir):
    """A checkpoint whose vocabulary is padded past its tokenizer's (as some are, for speed):
    train lm's result names the model's vocab_size and the tokenizer's, each its own."""
    tokenizer_size = Tokenizer.from_file(str(hf_dir / "tokenizer.json")).get_vocab_size()
    wide = tmp_path / "wide"
    sizes = dict(n_positions=16, n_embd=8, n_layer=1, n_head=2)
    config = GPT2Config(vocab_size=tokenizer_size + 7, **sizes)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(wide)
    shutil.copy(hf_dir / "tokenizer.json", wide)
    run, tuned, text = tmp_path / "run", tmp_path / "tuned", tmp_path / "text.txt"
    text.write_text(DEFAULT_TEXT)
    assert cli(capsys, "import-hf", str(wide), "--out", str(run))[0] == 0
    train = ["train", "lm", "--init", str(run), "--text", str(text), "--steps", "2"]
    assert cli(capsys, *train, "--context", "8", "--quiet", "--out", str(tuned))[0] == 0
    result = json.loads((tuned / "result.json").read_text())
    assert (result["vocab_size"], result["tokenizer_vocab_size"]) == (
        tokenizer_size + 7,
        tokenizer_size,
    )


def test_import_and_export_write_over_nothing_a_user_has(tmp_path, capsys, hf_dir):
    """export-hf back into the directory the model came from, or import-hf over a checkpoint:
    refused with exit 2, every file as it was."""
    run = tmp_path / "run"
    assert cli(capsys, "import-hf", str(hf_dir), "--out", str(run))[0] == 0
    before = {path: path.read_bytes() for path in [*hf_dir.iterdir(), *run.iterdir()]}
    npz = run / "checkpoint.npz"
    for out in (run, npz):
        status, _, err = cli(capsys, "import-hf", str(hf_dir), "--out", str(out))
        assert status == 2 and f"--out {out}: {npz} already exists; give another --out" in err
    status, _, err = cli(capsys, "export-hf", "--checkpoint", str(run), "--to", str(hf_dir))
    assert status == 2 and f"--to {hf_dir}: {hf_dir / 'config.json'}, " in err
    assert "model.safetensors" in err and "already exist; give a new" in err
    assert {path: path.read_bytes() for path in before} == before
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for command in (
        ("export-hf", "--checkpoint", str(run), "--to", str(a_file)),
        ("import-hf", str(hf_dir), "--out", str(a_file)),
    ):
        status, _, err = cli(capsys, *command)
        assert status == 2 and f"{a_file} is a file, not a directory" in err
    assert a_file.read_text() == "mine"


def test_import_names_a_directory_that_is_a_file_or_missing(tmp_path, capsys):
    """Each was refused as "DIR/config.json: not readable JSON ([Errno 20] Not a directory)"
    or "DIR/config.json: no such file": now the directory itself, exit 2, nothing written."""
    a_file, missing = tmp_path / "notes.txt", tmp_path / "gpt2"
    a_file.write_text("mine")
    for named, what in ((a_file, "a file, not a directory"), (missing, "no such directory")):
        status, _, err = cli(capsys, "import-hf", str(named), "--out", str(tmp_path / "run"))
        assert status == 2 and err.endswith(
            f"error: {named}: {what} (import-hf reads a Hugging Face model's directory)\n"
        ), err
    assert sorted(tmp_path.iterdir()) == [a_file] and a_file.read_text() == "mine"


def old_hub_layout(weights: dict) -> dict:
    """Weights as older hub files hold them: no "transformer." prefix, each block's causal
    mask buffers (attn.bias, attn.masked_bias), and the tied head saved as lm_head.weight."""
    out = {key.removeprefix("transformer."): value for key, value in weights.items()}
    for i in {key.split(".")[1] for key in out if key.startswith("h.")}:  # each block
        out[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))
        out[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    return out | {"lm_head.weight": out["wte.weight"].copy()}


def test_import_reads_the_old_hub_layout_and_a_config_without_the_newer_settings(
    tmp_path, capsys, hf_dir
):
    """The hub's original gpt2 has that layout, and a config.json that names none of the
    settings the import checks (hf.FIXED): they take transformers' defaults. The same
    parameters as from save_pretrained's directory, bit for bit."""
    directory = spoiled(tmp_path, hf_dir, state=old_hub_layout)
    config = json.loads((directory / "config.json").read_text())
    for name in hf.FIXED:
        config.pop(name, None)
    (directory / "config.json").write_text(json.dumps(config))
    old, new = tmp_path / "old", tmp_path / "new"
    assert cli(capsys, "import-hf", str(directory), "--out", str(old))[0] == 0
    assert cli(capsys, "import-hf", str(hf_dir), "--out", str(new))[0] == 0
    old_params, new_params = load_checkpoint(old).model.params, load_checkpoint(new).model.params
    assert list(old_params) == list(new_params)
    for key, value in new_params.items():
        np.testing.assert_array_equal(old_params[key], value)


def test_import_reads_through_a_safetensors_without_pread(tmp_path, capsys, hf_dir, monkeypatch):
    """safetensors before 0.8 has no backend argument (a TypeError, as pyo3 raises for any
    unknown keyword): import-hf then reads through safetensors' map of the file, to the same
    checkpoint, byte for byte."""
    import safetensors

    mapped = safetensors.safe_open

    def before_pread(path, framework, **options):
        if options:
            raise TypeError(f"safe_open() got an unexpected keyword argument {min(options)!r}")
        return mapped(path, framework)

    read, mapped_read = tmp_path / "read", tmp_path / "mapped"
    assert cli(capsys, "import-hf", str(hf_dir), "--out", str(read))[0] == 0
    monkeypatch.setattr(safetensors, "safe_open", before_pread)
    assert cli(capsys, "import-hf", str(hf_dir), "--out", str(mapped_read))[0] == 0
    saved = [(run / "checkpoint.npz").read_bytes() for run in (read, mapped_read)]
    assert saved[0] == saved[1] and len(saved[0]) > 0


def test_a_tensor_numpy_cannot_hold_is_refused_by_its_key(tmp_path, capsys, hf_dir):
    """A bfloat16 tensor (the header says so; NumPy has no such dtype) is read only when its
    weight is written, and refused then, naming the file and the key, with nothing written."""
    directory = spoiled(tmp_path, hf_dir)
    weights = directory / "model.safetensors"
    raw = weights.read_bytes()
    size = int.from_bytes(raw[:8], "little")  # the JSON header's length, then the header
    header = json.loads(raw[8 : 8 + size])
    key = "transformer.ln_f.bias"
    header[key] |= {"dtype": "BF16", "shape": [2 * header[key]["shape"][0]]}  # the same bytes
    text = json.dumps(header).encode()
    weights.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + size :])
    status, _, err = cli(capsys, "import-hf", str(directory), "--out", str(tmp_path / "run"))
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{weights}: tensor {key!r} is not readable (" in err and "bfloat16" in err, err
    assert not (tmp_path / "run").exists()


def test_mapping_a_state_refuses_an_untied_head_and_passes_over_a_tied_one(hf_dir):
    """engine_params_from_hf (the tests' and crosscheck's map of gradients and weights) keeps
    the import's rules: an lm_head.weight that is not wte.weight is refused."""
    state = old_hub_layout(load_file(hf_dir / "model.safetensors"))
    params = hf.engine_params_from_hf(state, 2)
    np.testing.assert_array_equal(params["tok_embed.weight"], state["wte.weight"])
    state["lm_head.weight"] = 2 * state["wte.weight"]
    with pytest.raises(ValueError, match="lm_head.weight differs from wte.weight"):
        hf.engine_params_from_hf(state, 2)


def test_import_of_torchs_pickled_weights_says_how_to_make_safetensors(tmp_path, capsys, hf_dir):
    """Older directories (save_pretrained before safetensors) hold pytorch_model.bin."""
    directory = tmp_path / "pickled"
    directory.mkdir()
    shutil.copy(hf_dir / "config.json", directory)
    weights = GPT2LMHeadModel.from_pretrained(hf_dir).state_dict()
    torch.save(weights, directory / "pytorch_model.bin")
    status, _, err = cli(capsys, "import-hf", str(directory), "--out", str(tmp_path / "run"))
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "pytorch_model.bin is torch's format: load it with transformers and" in err


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


@pytest.mark.parametrize(
    ("eos", "eos_id"), [(0, 0), (299, 299), (300, None), (None, None), ([7], None)]
)
def test_the_end_of_text_token_is_kept_when_it_is_an_id_of_the_vocabulary(eos, eos_id):
    """Of config.json's eos_token_id, generation keeps an id of the 300-token vocabulary, 0
    included; none, an id past it, or a list means no end-of-text token."""
    config = {"model_type": "gpt2", "vocab_size": 300, "n_embd": 16, "n_head": 2}
    config |= {"n_layer": 2, "n_positions": 32, "eos_token_id": eos}
    assert hf.config_from_hf(config, "float32").eos_id == eos_id


def test_export_refuses_a_model_that_is_not_gpt2(tmp_path, capsys):
    run = tmp_path / "char"
    assert cli(capsys, "train", "char-lm", "--steps", "2", "--quiet", "--out", str(run))[0] == 0
    status, _, err = cli(capsys, "export-hf", "--checkpoint", str(run), "--to", str(tmp_path / "x"))
    expected = "export-hf writes GPT-2 models (kind 'gpt2'); this checkpoint holds a MiniGPT"
    assert status == 2 and f"{expected} (kind 'gpt'), which `numpy-engine export` writes" in err


def test_without_the_hf_extra_the_commands_name_it(tmp_path, capsys, hf_dir, monkeypatch):
    for name in ("safetensors", "safetensors.numpy"):
        monkeypatch.setitem(sys.modules, name, None)  # `import safetensors` now fails
    status, _, err = cli(capsys, "import-hf", str(hf_dir), "--out", str(tmp_path / "run"))
    assert status == 2 and "needs the hf extra: pip install -e '.[hf]'" in err, err


def test_export_of_a_gpt2_over_characters_says_it_writes_no_tokenizer(tmp_path, capsys):
    """train lm without --init: a GPT-2 over the text's characters, whose vocabulary a Hugging
    Face directory has no file for. The weights load; a note says what is missing."""
    run, back = tmp_path / "chars", tmp_path / "hf"
    assert cli(capsys, "train", "lm", "--steps", "1", "--quiet", "--out", str(run))[0] == 0
    status, out, err = cli(capsys, "export-hf", "--checkpoint", str(run), "--to", str(back))
    assert (status, out) == (0, f"wrote {back}\n") and not (back / "tokenizer.json").exists()
    assert err.startswith(f"note: the checkpoint keeps no Hugging Face tokenizer, so {back} has")
    _, info = GPT2LMHeadModel.from_pretrained(back, output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))


def test_a_tokenizer_corpus_holds_the_texts_ids_and_decodes_them_back():
    tokenizer = bpe_tokenizer(DEFAULT_TEXT)
    corpus = TokenizerCorpus(tokenizer.to_str(), DEFAULT_TEXT)
    assert corpus.ids.tolist() == tokenizer.encode(DEFAULT_TEXT).ids
    assert corpus.decode(corpus.ids) == DEFAULT_TEXT
    assert corpus.vocab_size == tokenizer.get_vocab_size() == 281  # the trainer stops there


def pieces_of(text: TextSoFar, new_ids: list[int]) -> list[str]:
    """What generate shows: the prompt's settled text, each new id's, then the rest."""
    return [text.settled(), *(text.add(i) for i in new_ids), text.rest()]


BPE = bpe_tokenizer(DEFAULT_TEXT)  # ASCII merges; every other byte is an id of its own


@given(
    prompt=st.lists(st.integers(0, BPE.get_vocab_size() - 1), min_size=1, max_size=4),
    new_ids=st.lists(st.integers(0, BPE.get_vocab_size() - 1), max_size=24),
)
@example(prompt=BPE.encode("to").ids, new_ids=BPE.encode(" \u00e9\u20ac be").ids)
def test_generated_text_is_given_out_as_it_settles_and_adds_up_to_the_whole(prompt, new_ids):
    """Byte-level ids: the pieces add up to the decoded text of every id, and no piece but
    the last ends in the U+FFFD of a character whose bytes are still to come."""
    corpus = TokenizerCorpus(BPE.to_str())
    assert corpus.decodes_by_prefix
    pieces = pieces_of(TextSoFar(corpus, prompt), new_ids)
    assert "".join(pieces) == corpus.decode(prompt + new_ids)
    assert not any(piece.endswith("\ufffd") for piece in pieces[:-1]), pieces


def test_a_character_is_given_out_once_its_last_byte_comes():
    """e-acute is two bytes (two ids here), the euro sign three."""
    corpus = TokenizerCorpus(BPE.to_str())
    new_ids = BPE.encode("\u00e9\u20ac!").ids
    assert len(new_ids) == 6
    pieces = pieces_of(TextSoFar(corpus, BPE.encode("to").ids), new_ids)
    assert pieces == ["to", "", "\u00e9", "", "", "\u20ac", "!", ""]


def test_once_a_character_is_whole_its_ids_are_not_decoded_again(monkeypatch):
    """The prompt ends inside e-acute: "a" is given out, the first byte's id kept; once the
    second byte comes, the text is whole, and each later id is decoded alone."""
    corpus = TokenizerCorpus(BPE.to_str())
    decoded, decode = [], corpus.decode
    monkeypatch.setattr(corpus, "decode", lambda ids: (decoded.append(len(ids)), decode(ids))[1])
    a, e_acute, b = (BPE.encode(text).ids for text in ("a", "\u00e9", "b"))
    assert len(a) == len(b) == 1 and len(e_acute) == 2
    pieces = pieces_of(TextSoFar(corpus, a + e_acute[:1]), e_acute[1:] + b * 5)
    assert pieces == ["a", "\u00e9", *"b" * 5, ""]
    assert decoded == [2, 3, 1, 1, 1, 1, 1, 0]


def test_text_of_a_tokenizer_that_may_tidy_earlier_text_is_given_out_at_the_end():
    """A WordPiece decoder joins "##" pieces to the word before: text settles at the end."""
    vocab = {"[UNK]": 0, "to": 1, "be": 2, "##e": 3}
    wordpiece = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    wordpiece.pre_tokenizer, wordpiece.decoder = pre_tokenizers.Whitespace(), decoders.WordPiece()
    corpus = TokenizerCorpus(wordpiece.to_str())
    assert not corpus.decodes_by_prefix
    assert pieces_of(TextSoFar(corpus, [1]), [2, 3]) == ["", "", "", "to bee"]


def test_an_imported_model_is_not_a_run_to_resume_and_says_how_to_train_it(
    tmp_path, capsys, hf_dir
):
    """--steps was refused as "not applying" before the real reason; now either way the
    refusal says the checkpoint holds no run, and that train lm --init starts one from it."""
    run = tmp_path / "run"
    assert cli(capsys, "import-hf", str(hf_dir), "--out", str(run))[0] == 0
    for extra in ([], ["--steps", "5"]):
        status, _, err = cli(capsys, "train", "--resume", str(run), *extra)
        assert status == 2 and "cannot be resumed: it holds no training run's state" in err, err
        assert err.rstrip().endswith(f"start a run from it: train lm --init {run}"), err
