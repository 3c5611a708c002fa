"""The `generate` command: the library's generate or greedy_decode with the flags' values,
text shown as it comes and kept on Ctrl-C, and the sampling flags refused for a copy model."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from numpy_engine import cli_generate
from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.cli import main as engine_main
from numpy_engine.generate import generate, greedy_decode
from numpy_engine.models.minigpt import MiniGPT
from numpy_engine.tasks import corpus_from_meta


def test_generate_shows_its_text_as_it_comes_and_ctrl_c_keeps_it(tmp_path):
    """Asked for 10^8 tokens, generate has shown the prompt and generated characters long
    before its end; Ctrl-C then stops it with the text shown so far and the line ended."""
    out = tmp_path / "run"
    assert engine_main(["train", "char-lm", "--steps", "1", "--out", str(out), "--quiet"]) == 0
    args = [
        "generate",
        "--checkpoint",
        str(out),
        "--prompt",
        "to ",
        "--max-new-tokens",
        "100000000",
    ]
    with subprocess.Popen(
        [sys.executable, "-m", "numpy_engine", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    ) as run:
        shown, deadline = b"", time.monotonic() + 60
        while len(shown) < 40 and time.monotonic() < deadline:  # the prompt, 37 characters more
            if select.select([run.stdout], [], [], 1.0)[0]:
                shown += os.read(run.stdout.fileno(), 4096) or b"(ended)"
        run.send_signal(signal.SIGINT)
        rest, err = run.communicate(timeout=60)
    text = (shown + rest).decode()
    assert len(shown) >= 40, shown  # before Ctrl-C, before the end
    assert run.returncode == 130 and err.decode() == "numpy-engine generate: interrupted\n", err
    assert text.startswith("to ") and text.endswith("\n") and len(text) > 40, text


@pytest.fixture(scope="module")
def untrained_char(tmp_path_factory):
    """A char-lm checkpoint of one step: its next characters are near-uniform, so a draw
    depends on every sampling flag."""
    out = tmp_path_factory.mktemp("untrained-char")
    assert engine_main(["train", "char-lm", "--steps", "1", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.parametrize(
    "flags, expected",  # expected: generate's (max_new_tokens, temperature, top_k, top_p, seed)
    [
        ([], (80, 0.0, None, None, 0)),
        (["--max-new-tokens", "7", "--temperature", "1.5", "--seed", "3"], (7, 1.5, None, None, 3)),
        (["--max-new-tokens", "9", "--top-k", "3", "--seed", "5"], (9, 1.0, 3, None, 5)),
        (["--max-new-tokens", "9", "--top-p", "0.5", "--seed", "1"], (9, 1.0, None, 0.5, 1)),
        (["--max-new-tokens", "6", "--no-cache"], (6, 0.0, None, None, 0)),
        (["--max-new-tokens", "5", "--temperature", "0"], (5, 0.0, None, None, 0)),  # greedy
    ],
)
def test_generate_from_a_prompt_is_the_librarys_generate(
    untrained_char, flags, expected, capsys, monkeypatch
):
    """The shown text is the library's generate with the flags' values (or the defaults:
    80 new tokens, greedy, seed 0), through the KV cache unless --no-cache. The prompt is
    shown before the first step; each new token takes the logits once, and the last one
    is not run through the model (nothing reads its logits)."""
    checkpoint = load_checkpoint(untrained_char, optimizer=False)
    corpus = corpus_from_meta(checkpoint.meta)
    ids = corpus.encode("to ")
    wanted = corpus.decode(generate(checkpoint.model, ids, *expected)[0]) + "\n"
    events, make_decoder, show = [], MiniGPT.decoder, cli_generate._show
    monkeypatch.setattr(MiniGPT, "decoder", recorded_decoder(make_decoder, events))

    def shown(piece: str) -> None:
        events.append(("show", piece))
        show(piece)

    monkeypatch.setattr(cli_generate, "_show", shown)
    capsys.readouterr()
    run = ["generate", "--checkpoint", str(untrained_char), "--prompt", "to ", *flags]
    assert engine_main(run) == 0
    assert capsys.readouterr().out == wanted
    assert events[:2] == [("show", "to "), ("decoder", "--no-cache" not in flags)]
    assert events.count("logits") == expected[0] and events.count("append") == expected[0] - 1


def recorded_decoder(make_decoder, events: list):
    """MiniGPT.decoder, its making and each call of the decoder it makes noted in events."""

    class Recorded:
        def __init__(self, decoder) -> None:
            self.decoder = decoder

        def next_logits(self):
            events.append("logits")
            return self.decoder.next_logits()

        def append(self, next_ids) -> None:
            events.append("append")
            self.decoder.append(next_ids)

    def decoder(model, prompt, use_cache=True):
        events.append(("decoder", use_cache))
        return Recorded(make_decoder(model, prompt, use_cache))

    return decoder


class FlushRecorder:
    """A stdout that notes each write and each flush, in order."""

    def __init__(self) -> None:
        self.events: list = []
        self.encoding = "utf-8"

    def write(self, text: str) -> int:
        self.events.append(("write", text))
        return len(text)

    def flush(self) -> None:
        self.events.append("flush")


def test_each_piece_of_generated_text_is_flushed_as_it_comes(untrained_char, monkeypatch):
    """Each piece goes out when it is written: a pipe's stdout is block-buffered, so without
    a flush a piece would wait in the buffer until 8 KB had filled it (the subprocess test
    above still passes then: an untrained model fills 8 KB in seconds)."""
    stdout = FlushRecorder()
    monkeypatch.setattr(sys, "stdout", stdout)
    run = ["generate", "--checkpoint", str(untrained_char), "--prompt", "to ", "--max-new-tokens"]
    assert engine_main([*run, "5"]) == 0
    writes = [i for i, event in enumerate(stdout.events) if event != "flush"]
    assert len(writes) >= 2 and stdout.events[writes[0]] == ("write", "to ")
    assert all(stdout.events[i + 1 : i + 2] == ["flush"] for i in writes), stdout.events


@pytest.mark.parametrize(
    "flags, max_new, cached",
    [([], 4, True), (["--max-new-tokens", "2"], 2, True), (["--no-cache"], 4, False)],
)
def test_generate_from_a_source_is_the_librarys_greedy_decode(
    untrained_copy, flags, max_new, cached, capsys, monkeypatch
):
    """As many tokens as the source has symbols, and EOS, unless --max-new-tokens says;
    through the decoder's cache unless --no-cache (the same tokens either way)."""
    import numpy_engine.generate

    use_cache, decode = [], numpy_engine.generate.greedy_decode

    def recorded(model, source, max_new_tokens, use_cache_given):
        use_cache.append(use_cache_given)
        return decode(model, source, max_new_tokens, use_cache_given)

    monkeypatch.setattr(numpy_engine.generate, "greedy_decode", recorded)
    capsys.readouterr()
    assert (
        engine_main(
            ["generate", "--checkpoint", str(untrained_copy), "--source", "4", "7", "9", *flags]
        )
        == 0
    )
    assert use_cache == [cached]
    model = load_checkpoint(untrained_copy).model
    generated = greedy_decode(model, np.array([[4, 7, 9]]), max_new)[0]
    assert (generated != 0).all()  # no EOS before the end, so no padding: all max_new shown
    assert capsys.readouterr().out == " ".join(map(str, generated)) + "\n"


@pytest.mark.parametrize("flag", [["--temperature", "1"], ["--top-k", "2"], ["--top-p", "0.5"]])
def test_each_sampling_flag_is_refused_for_a_copy_checkpoint(untrained_copy, flag, capsys):
    run = ["generate", "--checkpoint", str(untrained_copy), "--source", "4", *flag]
    assert engine_main(run) == 2
    assert "are for language models (char-lm, lm); copy/reverse decode greedily" in (
        capsys.readouterr().err
    )
