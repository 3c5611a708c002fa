"""The tokenizer of a Hugging Face directory through import-hf, train lm --init and
export-hf: read and kept in the checkpoint, refused by name when spoiled, missing with a
note that says how to make it, and a model wider than it or a GPT-2 over characters with
each size named."""

from __future__ import annotations

import json
import shlex
import shutil

import pytest
import torch
from tokenizers import Tokenizer
from transformers import GPT2Config, GPT2LMHeadModel

from numpy_engine import cli_hf, hf
from numpy_engine.checkpoint import load_checkpoint, save_checkpoint
from numpy_engine.tasks import DEFAULT_TEXT, TokenizerCorpus
from parity_tests.hf_cases import cli, spoiled


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


@pytest.mark.parametrize(
    ("eos", "eos_id"), [(0, 0), (299, 299), (300, None), (None, None), ([7], None)]
)
def test_the_end_of_text_token_is_kept_when_it_is_an_id_of_the_vocabulary(eos, eos_id):
    """Of config.json's eos_token_id, generation keeps an id of the 300-token vocabulary, 0
    included; none, an id past it, or a list means no end-of-text token."""
    config = {"model_type": "gpt2", "vocab_size": 300, "n_embd": 16, "n_head": 2}
    config |= {"n_layer": 2, "n_positions": 32, "eos_token_id": eos}
    assert hf.config_from_hf(config, "float32").eos_id == eos_id


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
