"""A tokenizer's text: a TokenizerCorpus holds a text's ids and decodes them back, and
TextSoFar gives generated text out as it settles, a character once its last byte comes."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from numpy_engine.tasks import DEFAULT_TEXT, TextSoFar, TokenizerCorpus
from parity_tests.hf_cases import bpe_tokenizer


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
