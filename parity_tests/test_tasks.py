"""The data: the copy/reverse split and the character corpus."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_engine.configs import REFERENCE_RUNS
from numpy_engine.tasks import (
    BOS,
    DEFAULT_TEXT,
    EOS,
    PAD,
    SHOWN_VOCABULARY,
    CharCorpus,
    Corpus,
    TextSoFar,
    every_target_once,
    read_text,
    sequence_task,
    split_off_heldout,
)


def rows(split) -> set[tuple[int, ...]]:
    return {tuple(row) for row in split.source}


def test_copy_split_sizes_are_disjoint_and_cover_every_sequence():
    task = sequence_task("copy", seed=7)
    assert (len(task.train), len(task.test)) == (467, 117)
    assert rows(task.train).isdisjoint(rows(task.test))
    lengths = (np.vstack([task.train.source, task.test.source]) != PAD).sum(axis=1)
    assert np.bincount(lengths).tolist() == [0, 8, 64, 512]


def test_copy_rows_are_bos_tokens_and_tokens_eos():
    split = sequence_task("copy", seed=7).train
    assert split.source.shape == (467, 3) and split.target.shape == (467, 4)
    for source, decoder_input, target in zip(
        split.source[:50], split.decoder_input[:50], split.target[:50], strict=True
    ):
        tokens = [int(t) for t in source if t != PAD]
        n = len(tokens)
        assert decoder_input.tolist() == [BOS, *tokens] + [PAD] * (3 - n)
        assert target.tolist() == [*tokens, EOS] + [PAD] * (3 - n)


def test_reverse_reverses_the_targets_on_the_same_split():
    copy, reverse = sequence_task("copy", seed=3), sequence_task("reverse", seed=3)
    assert (copy.name, reverse.name) == ("copy", "reverse")
    np.testing.assert_array_equal(copy.test.source, reverse.test.source)
    source, target = reverse.test.source[0], reverse.test.target[0]
    tokens = [int(t) for t in source if t != PAD]
    assert target.tolist()[: len(tokens) + 1] == [*tokens[::-1], EOS]


def test_the_split_depends_on_the_seed():
    trained_on = sequence_task("copy", seed=REFERENCE_RUNS["copy"].seed)
    assert rows(sequence_task("copy").test) == rows(trained_on.test)  # the default: train copy's
    assert rows(sequence_task(seed=1).test) != rows(sequence_task(seed=2).test)
    with pytest.raises(ValueError, match="task must be 'copy' or 'reverse'"):
        sequence_task("sort")


def test_char_corpus_vocabulary_and_shifted_windows():
    corpus = CharCorpus(DEFAULT_TEXT)
    assert corpus.vocab_size == 13 and corpus.decode(corpus.encode("to be")) == "to be"
    idx, targets = corpus.batch(np.random.default_rng(0), batch_size=5, context=8)
    assert idx.shape == targets.shape == (5, 8)
    np.testing.assert_array_equal(idx[:, 1:], targets[:, :-1])


def test_char_corpus_errors(tmp_path):
    with pytest.raises(ValueError, match="^text has characters outside the vocabulary: \\['x'\\] "):
        CharCorpus("to be").encode("box")
    with pytest.raises(
        ValueError, match="^--prompt has .* \\(the model's 5 characters are ' beot'\\)$"
    ):
        CharCorpus("to be").encode("box", what="--prompt")
    at_limit = "".join(chr(0x4E00 + i) for i in range(SHOWN_VOCABULARY))  # listed in full
    with pytest.raises(ValueError, match=f"{SHOWN_VOCABULARY} characters are '{at_limit}'\\)$"):
        CharCorpus(at_limit).encode("x")
    wide = at_limit + "\u9fff"  # one more: counted, not listed
    with pytest.raises(ValueError, match=f"\\['x'\\] \\(the model's {len(wide)} characters\\)$"):
        CharCorpus(wide).encode("x")
    with pytest.raises(ValueError, match="a context of 8 needs at least 9"):
        CharCorpus("abcd").batch(np.random.default_rng(0), 2, 8)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="latin1.txt: not UTF-8"):
        read_text(tmp_path / "latin1.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty.txt is empty"):
        read_text(tmp_path / "empty.txt")
    with pytest.raises(ValueError, match="missing.txt: cannot read it"):
        read_text(tmp_path / "missing.txt")


def ids_corpus(n: int) -> Corpus:
    corpus = Corpus()
    corpus.ids = np.arange(n)
    return corpus


def test_windows_reach_both_ends_of_the_text():
    """The shortest text a context takes has one window, the whole text; a window may start
    at the first token and end at the last."""
    idx, targets = ids_corpus(9).batch(np.random.default_rng(0), batch_size=3, context=8)
    assert idx.tolist() == [list(range(8))] * 3 and targets.tolist() == [list(range(1, 9))] * 3
    idx, targets = ids_corpus(10).batch(np.random.default_rng(0), batch_size=64, context=8)
    assert sorted(set(idx[:, 0].tolist())) == [0, 1] and targets.max() == 9
    with pytest.raises(ValueError, match="the text has 8 tokens; a context of 8 needs at least 9"):
        ids_corpus(8).batch(np.random.default_rng(0), 2, 8)


def test_a_char_corpus_needs_two_characters():
    assert CharCorpus("ab").ids.tolist() == [0, 1]  # one (input, next) pair
    with pytest.raises(ValueError, match="text must have at least 2 characters, got 1"):
        CharCorpus("a")


@pytest.mark.parametrize("n", [9, 10, 16, 17, 18, 30])  # one window; a short last one; exact
def test_held_out_windows_make_every_token_but_the_first_a_target_once(n):
    ids = np.arange(100, 100 + n)
    idx, targets = every_target_once(ids, context=8, ignore_index=-100)
    counted = targets != -100
    assert idx.shape == targets.shape == (-(-(n - 1) // 8), 8)
    assert targets[counted].tolist() == ids[1:].tolist()  # each once, in order
    assert idx[counted].tolist() == ids[:-1].tolist()  # each predicted from the token before
    assert counted[:-1].all() and counted[-1].sum() == (n - 1) - 8 * (len(idx) - 1)
    assert (idx[~counted] == ids[-1]).all()  # past the end: the last token again


def test_a_holdout_is_the_texts_end_and_each_part_must_hold_a_window():
    train, heldout = split_off_heldout(np.arange(40), 0.25, context=8)
    assert train.tolist() == list(range(30)) and heldout.tolist() == list(range(30, 40))
    for fraction, held_out in ((0.225, 9), (0.775, 31)):  # one part just one window long
        assert len(split_off_heldout(np.arange(40), fraction, context=8)[1]) == held_out
    with pytest.raises(ValueError, match="holdout=0.2 leaves the held-out part 8 of the text's 40"):
        split_off_heldout(np.arange(40), 0.2, context=8)
    with pytest.raises(ValueError, match="leaves the training part 4 of the text's 40 tokens; a"):
        split_off_heldout(np.arange(40), 0.9, context=8)


def test_text_so_far_decodes_only_the_ids_since_the_last_whole_character(monkeypatch):
    """A long generation costs no more a token than a short one: after the prompt, each
    character's id is decoded alone, and the pieces are the characters."""
    corpus = CharCorpus(DEFAULT_TEXT)
    decoded = []
    decode = corpus.decode
    monkeypatch.setattr(corpus, "decode", lambda ids: (decoded.append(len(ids)), decode(ids))[1])
    new_ids = corpus.encode(DEFAULT_TEXT * 4)
    text = TextSoFar(corpus, corpus.encode("to "))
    pieces = [text.settled(), *(text.add(i) for i in new_ids), text.rest()]
    assert pieces == ["to ", *DEFAULT_TEXT * 4, ""]
    assert decoded == [3, *[1] * len(new_ids), 0]
