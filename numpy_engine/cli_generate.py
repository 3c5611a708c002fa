"""`generate`: greedy decoding from a copy/reverse checkpoint, greedy or sampled text from a
language model's, shown as each token comes (registered by cli.py)."""

from __future__ import annotations

import argparse
import sys

from numpy_engine.checks import InputError
from numpy_engine.cli_args import (
    add_checkpoint_argument,
    add_source_or_prompt,
    non_negative_float,
    non_negative_int,
    positive_int,
    probability,
    source_ids,
)


def add_generate_command(commands) -> None:
    gen = commands.add_parser(
        "generate",
        help="generate from a trained checkpoint",
        description="Greedy decoding from a copy/reverse checkpoint (--source), or greedy / "
        "sampled text from a language model's checkpoint (--prompt): char-lm, lm, or a GPT-2 "
        "made by import-hf. The text is shown as each token comes; Ctrl-C stops it and keeps "
        "what was shown.",
    )
    add_checkpoint_argument(gen)
    add_source_or_prompt(
        gen, "the output ends at EOS (2)", 'the text to continue (e.g. --prompt "to ")'
    )
    gen.add_argument(
        "--max-new-tokens",
        type=positive_int,
        help="tokens to generate (default: copy/reverse the source's length + 1, EOS included; "
        "char-lm, lm 80)",
    )
    gen.add_argument(
        "--temperature",
        type=non_negative_float,
        help="char-lm, lm: 0 is greedy; above 0 samples from softmax(logits / T) (default: 0, or 1 "
        "with --top-k / --top-p)",
    )
    gen.add_argument(
        "--top-k", type=positive_int, help="char-lm, lm: sample among the k likeliest (samples)"
    )
    gen.add_argument(
        "--top-p",
        type=probability,
        help="char-lm, lm: sample among the likeliest whose mass reaches p, 0 < p <= 1 (samples)",
    )
    gen.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        help="char-lm, lm: the sampler's seed (default: 0)",
    )
    gen.add_argument(
        "--no-cache",
        action="store_true",
        help="rerun the whole prefix at every step instead of using the KV cache "
        "(same output, slower; for comparison)",
    )
    gen.set_defaults(run=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from numpy_engine.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(args.checkpoint, optimizer=False)
    if checkpoint.model.continues_prompt:
        return _generate_text(args, checkpoint)
    return _generate_sequence(args, checkpoint)


def _sampling(args: argparse.Namespace) -> float:
    """The temperature: as given; 1 where only --top-k or --top-p asks to sample; else 0."""
    asks_to_sample = args.top_k is not None or args.top_p is not None
    if args.temperature is None:
        return 1.0 if asks_to_sample else 0.0
    if args.temperature == 0 and asks_to_sample:
        raise InputError(
            "--top-k and --top-p sample: they need --temperature above 0 (0 is greedy)"
        )
    return args.temperature


def _generate_text(args: argparse.Namespace, checkpoint) -> int:
    """The prompt and its continuation on stdout, each token's text as soon as it is settled
    (tasks.TextSoFar); Ctrl-C keeps what was shown and ends the line."""
    from numpy_engine.generate import continuation
    from numpy_engine.tasks import TextSoFar, corpus_from_meta

    if args.prompt is None:
        raise InputError("this is a language-model checkpoint: give --prompt, not --source")
    corpus = corpus_from_meta(checkpoint.meta)
    ids = corpus.encode(args.prompt, what="--prompt")
    if len(ids) == 0:
        raise InputError("--prompt is empty")
    temperature, max_new = _sampling(args), args.max_new_tokens or 80
    steps = continuation(  # checks its arguments here, before anything is shown
        checkpoint.model,
        ids,
        max_new,
        temperature,
        args.top_k,
        args.top_p,
        args.seed,
        use_cache=not args.no_cache,
    )
    text = TextSoFar(corpus, ids)
    _show(text.settled())
    try:
        for next_ids in steps:  # (1,): one prompt
            _show(text.add(next_ids[0]))
    finally:  # the end, or Ctrl-C: what is left, and the line's end
        _show(text.rest() + "\n")
    return 0


def _show(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()  # a token at a time, not when the buffer fills


def _generate_sequence(args: argparse.Namespace, checkpoint) -> int:
    from numpy_engine.generate import greedy_decode

    model, cfg = checkpoint.model, checkpoint.model.config
    source = source_ids(args.source, checkpoint)
    if any(value is not None for value in (args.temperature, args.top_k, args.top_p)):
        raise InputError(
            "--temperature, --top-k and --top-p are for language models (char-lm, lm); "
            "copy/reverse decode greedily"
        )
    max_new = args.max_new_tokens or source.shape[1] + 1  # the symbols, then EOS
    generated = greedy_decode(model, source, max_new, not args.no_cache)[0]
    shown = [int(i) for i in generated if i != cfg.pad_id]  # greedy_decode pads after EOS
    print(" ".join(map(str, shown)))
    return 0
