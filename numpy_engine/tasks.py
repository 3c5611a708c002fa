"""The data: copy / reverse sequence tasks and a character corpus.

Copy task vocabulary: PAD=0, BOS=1, EOS=2, id 3 unused, symbols 4..11. Every
sequence of 1 to 3 symbols (8 + 64 + 512 = 584) appears once; a seeded permutation
splits them 80/20, disjoint. Shapes: source (N, 3), decoder_input and target (N, 4).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from numpy_engine.checks import InputError

PAD, BOS, EOS = 0, 1, 2
SYMBOLS = tuple(range(4, 12))
SEQUENCE_TASKS = ("copy", "reverse")
COPY_VOCAB_SIZE = 12
MAX_SEQUENCE_LENGTH = 3
DEFAULT_TEXT = "to be or not to be that is the question " * 50


@dataclass(frozen=True)
class Split:
    source: np.ndarray  # (N, 3) symbols then PAD
    decoder_input: np.ndarray  # (N, 4) BOS + symbols, then PAD
    target: np.ndarray  # (N, 4) output symbols + EOS, then PAD

    def __len__(self) -> int:
        return len(self.source)

    def take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.source[rows], self.decoder_input[rows], self.target[rows]


@dataclass(frozen=True)
class SequenceTask:
    name: str  # "copy" or "reverse"
    train: Split
    test: Split


def _pad(rows: list[list[int]], width: int) -> np.ndarray:
    return np.array([row + [PAD] * (width - len(row)) for row in rows], dtype=np.int64)


def _split(sequences: list[tuple[int, ...]], reverse: bool) -> Split:
    outputs = [seq[::-1] if reverse else seq for seq in sequences]
    W = MAX_SEQUENCE_LENGTH
    return Split(
        source=_pad([list(seq) for seq in sequences], W),
        decoder_input=_pad([[BOS, *out] for out in outputs], W + 1),
        target=_pad([[*out, EOS] for out in outputs], W + 1),
    )


def sequence_task(name: str = "copy", seed: int = 7, train_fraction: float = 0.8) -> SequenceTask:
    """Every sequence of 1..3 symbols, split by a permutation drawn from seed."""
    if name not in SEQUENCE_TASKS:
        raise InputError(f"task must be 'copy' or 'reverse', got {name!r}")
    sequences = [
        s for n in range(1, MAX_SEQUENCE_LENGTH + 1) for s in itertools.product(SYMBOLS, repeat=n)
    ]
    order = np.random.default_rng(seed).permutation(len(sequences))
    n_train = int(train_fraction * len(sequences))  # 467 of 584
    pick = [sequences[i] for i in order]
    reverse = name == "reverse"
    return SequenceTask(name, _split(pick[:n_train], reverse), _split(pick[n_train:], reverse))


# ------------------------------------------------------------------------ characters


def read_text(path: str | Path) -> str:
    """A UTF-8 text file's contents; a clear ValueError if it is missing, not UTF-8, or empty."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InputError(f"text file {path}: cannot read it ({error.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"text file {path}: not UTF-8 (byte {error.start})") from None
    if not text:
        raise InputError(f"text file {path} is empty")
    return text


SHOWN_VOCABULARY = 120  # characters an unknown-character error lists, at most


class Corpus:
    """A text as token ids, cut into (input, next-token) windows. Subclasses say how text
    becomes ids: CharCorpus by its characters, TokenizerCorpus by a Hugging Face tokenizer."""

    ids: np.ndarray  # (tokens,)
    vocab_size: int
    # decode(ids + more) starts with decode(ids), but for the U+FFFD of a character whose
    # bytes are not all there yet: generated text can be shown as it comes (TextSoFar)
    decodes_by_prefix: bool = False

    def encode(self, text: str, what: str = "text") -> np.ndarray:
        """text's ids; what names it in an error (e.g. "--prompt")."""
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def codec(self) -> dict:
        """What a checkpoint's meta keeps to encode and decode again (see corpus_from_meta)."""
        raise NotImplementedError

    def batch(self, rng: np.random.Generator, batch_size: int, context: int) -> tuple:
        """batch_size random windows of the text: see random_windows."""
        return random_windows(self.ids, rng, batch_size, context)


def random_windows(ids: np.ndarray, rng: np.random.Generator, batch_size: int, context: int):
    """batch_size random windows of ids: idx (B, T) and targets (B, T), targets = idx shifted
    by 1."""
    if len(ids) < context + 1:
        raise InputError(
            f"the text has {len(ids)} tokens; a context of {context} needs at least {context + 1}"
        )
    starts = rng.integers(0, len(ids) - context, size=batch_size)  # (B,)
    windows = starts[:, None] + np.arange(context + 1)  # (B, T + 1)
    chunk = ids[windows]
    return chunk[:, :-1], chunk[:, 1:]


def split_off_heldout(ids: np.ndarray, fraction: float, context: int) -> tuple:
    """(the ids to train on, the held-out ids): the last `fraction` of the tokens held out, so
    that no training window overlaps them. Each part needs one window, context + 1 tokens."""
    heldout = round(len(ids) * fraction)
    for part, size in (("held-out", heldout), ("training", len(ids) - heldout)):
        if size < context + 1:
            raise InputError(
                f"holdout={fraction} leaves the {part} part {size} of the text's {len(ids)} "
                f"tokens; a context of {context} needs at least {context + 1}"
            )
    return ids[:-heldout], ids[-heldout:]


def every_target_once(ids: np.ndarray, context: int, ignore_index: int) -> tuple:
    """ids as windows in which every token but the first is a target exactly once: idx (W, T)
    and targets (W, T), window w starting at token w T; the last window's targets past the
    end are ignore_index (its inputs there repeat the last token: causal attention keeps
    them from the targets that count)."""
    n_windows = -(-(len(ids) - 1) // context)  # ceil((n - 1) / T)
    padded = np.full(n_windows * context + 1, ids[-1])
    padded[: len(ids)] = ids
    starts = np.arange(n_windows)[:, None] * context  # (W, 1)
    chunk = padded[starts + np.arange(context + 1)]  # (W, T + 1)
    targets = chunk[:, 1:].copy()
    targets.reshape(-1)[len(ids) - 1 :] = ignore_index  # the positions past the last token
    return chunk[:, :-1], targets


class CharCorpus(Corpus):
    """A text as ids over its sorted characters (or over a given vocabulary's)."""

    decodes_by_prefix = True  # one character an id

    def __init__(self, text: str, vocabulary: str | None = None, what: str = "text") -> None:
        """what: what to call the text in an error ("--text", "the built-in text")."""
        if len(text) < 2 and vocabulary is None:
            raise InputError(f"{what} must have at least 2 characters, got {len(text)}")
        self.chars = sorted(set(text if vocabulary is None else vocabulary))
        self.index = {ch: i for i, ch in enumerate(self.chars)}
        self.ids = self.encode(text, what)  # (len(text),)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str, what: str = "text") -> np.ndarray:
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            known = "".join(self.chars)
            listed = f" are {known!r}" if len(known) <= SHOWN_VOCABULARY else ""
            raise InputError(
                f"{what} has characters outside the vocabulary: {unknown!r} (the model's "
                f"{len(known)} characters{listed})"
            )
        return np.array([self.index[ch] for ch in text], dtype=np.int64)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def codec(self) -> dict:
        return {"vocabulary": "".join(self.chars)}


class TokenizerCorpus(Corpus):
    """A text as the ids of a Hugging Face tokenizer (its tokenizer.json; the hf extra)."""

    def __init__(
        self, tokenizer_json: str, text: str = "", where: str = "the checkpoint's tokenizer"
    ) -> None:
        """where: what to call tokenizer_json in an error (a file, or a checkpoint's)."""
        try:
            from tokenizers import Tokenizer, decoders
        except ImportError:
            raise InputError(f"{where} needs the hf extra: pip install -e '.[hf]'") from None
        self.tokenizer_json = tokenizer_json
        try:
            self.tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception as error:  # tokenizers raises a bare Exception for malformed JSON
            raise InputError(f"{where}: not a readable tokenizer ({error})") from None
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.ids = self.encode(text)
        # byte-level (GPT-2's): an id's bytes are appended to the others', then read as UTF-8
        self.decodes_by_prefix = isinstance(self.tokenizer.decoder, decoders.ByteLevel)

    def encode(self, text: str, what: str = "text") -> np.ndarray:
        return np.array(self.tokenizer.encode(text).ids, dtype=np.int64)  # bytes: never unknown

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def codec(self) -> dict:
        return {"tokenizer": self.tokenizer_json}


UNFINISHED = "\ufffd"  # what UTF-8 decoding makes of a character's first bytes alone


class TextSoFar:
    """The text of a prompt's ids and of the ids generated after it, given out as it settles:
    what later ids cannot change. With a corpus that decodes_by_prefix, that is all of it but
    a character whose bytes are not all there yet (a byte-level tokenizer's id may hold part
    of one: it reads as U+FFFD until the rest comes); with another, the text settles only at
    the end (a tokenizer may tidy earlier text as ids come, e.g. the spaces before "."),
    where rest() gives it all. The pieces given out add up to corpus.decode of every id.

    Only the ids since the text last ended on a whole character are decoded again (the
    text of the ones before it cannot change), so a long generation costs no more a token
    than a short one."""

    def __init__(self, corpus: Corpus, prompt_ids) -> None:
        self.corpus = corpus
        self.pending = [int(i) for i in prompt_ids]  # the ids whose text is not all given out
        self.given = ""  # the part of the pending ids' text given out

    def settled(self) -> str:
        """The settled text not given out yet (the prompt's, at first); gives it out."""
        if not self.corpus.decodes_by_prefix:
            return ""
        text = self.corpus.decode(self.pending)
        settled = text.rstrip(UNFINISHED)
        new = self._give(settled)
        if settled == text:  # it ends on a whole character: the next ids decode on their own
            self.pending, self.given = [], ""
        return new

    def add(self, next_id) -> str:
        """Takes the next generated id; returns the text it settles (often its own text; ""
        while a character's bytes are incomplete, then the whole character)."""
        self.pending.append(int(next_id))
        return self.settled()

    def rest(self) -> str:
        """Every id has come: the text not given out yet."""
        return self._give(self.corpus.decode(self.pending))

    def _give(self, text: str) -> str:
        if not text.startswith(self.given):  # decodes_by_prefix promised it could not be
            raise AssertionError(f"{self.given!r} is not the start of {text!r}")
        new, self.given = text[len(self.given) :], text
        return new


def corpus_from_meta(meta: dict, text: str = "", what: str = "text") -> Corpus:
    """text as ids under the tokenizer a checkpoint's meta keeps: a Hugging Face tokenizer
    ("tokenizer") or a character vocabulary ("vocabulary"). what: what to call the text in
    an error (a tokenizer reads any text)."""
    if "tokenizer" in meta:
        return TokenizerCorpus(meta["tokenizer"], text)
    if "vocabulary" in meta:
        return CharCorpus(text, vocabulary=meta["vocabulary"], what=what)
    raise InputError(
        "the checkpoint keeps no tokenizer or vocabulary, so it cannot read text: import-hf "
        "keeps the tokenizer.json it finds in the directory (put it there, then import again)"
    )
