"""A random transformers GPT-2 with a trained byte-level BPE tokenizer, saved as
save_pretrained writes it, goes through the command line: import-hf, generate (the same
tokens as transformers' greedy generate), train lm --init (the loss falls) and --resume,
export-hf back into from_pretrained. And each malformed directory is refused by name.
Sharded directories: test_hf_shards.py; the tokenizer a model is imported, trained and
exported with: test_hf_tokenizer.py; a tokenizer's text as it is generated:
test_tokenizer_text.py."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from tokenizers import Tokenizer
from transformers import GPT2LMHeadModel

from numpy_engine import hf
from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.tasks import DEFAULT_TEXT
from parity_tests.hf_cases import EOT, bpe_tokenizer, cli, spoiled


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


def _config_changed(directory, drop: tuple = (), **changes):
    config = json.loads((directory / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in drop} | changes
    (directory / "config.json").write_text(json.dumps(config))


def _tokenizer_larger_than_the_model(directory):
    tokenizer = bpe_tokenizer(DEFAULT_TEXT + "".join(map(chr, range(0x400, 0x500))))
    tokenizer.save(str(directory / "tokenizer.json"))


@pytest.mark.parametrize(
    ("spoil", "words"),
    [
        (lambda d: (d / "config.json").write_text("[1, 2]"), "a JSON list, not an object"),
        (_no_n_embd, "config.json has no n_embd"),
        (  # d_ff was 4 * None: a TypeError
            lambda d: _config_changed(d, drop=("n_inner",), n_embd=None),
            "config.json's n_embd must be an int, got NoneType None",
        ),
        (  # the eos id was compared with the text: a TypeError
            lambda d: _config_changed(d, vocab_size="50257", eos_token_id=5),
            "config.json's vocab_size must be an int, got str '50257'",
        ),
        (  # transformers' n_inner is taken as given unless null: 0 was read as 4 * n_embd
            lambda d: _config_changed(d, n_inner=0),
            "config.json's n_inner must be positive, got 0",
        ),
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
        "config-n_embd-null",
        "config-vocab_size-text",
        "config-n_inner-0",
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
