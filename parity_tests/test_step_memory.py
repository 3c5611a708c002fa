"""What a training run checks against free memory before its first step
(step_memory.check_step_fits, which refuses a run whose steps would not fit): the bytes it counts
(step_memory.step_bytes) are at least what the run's first steps allocate, measured with
tracemalloc (NumPy reports its arrays to it), for every kind, size and dtype drawn, and not
so many more that a run that fits would be refused. What reading a checkpoint holds:
test_read_memory.py."""

from __future__ import annotations

import re
import tracemalloc
import weakref
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from numpy_engine import loop, memory, train
from numpy_engine.checkpoint import load_checkpoint
from numpy_engine.configs import CharTrainConfig, SequenceTrainConfig
from numpy_engine.loop import Checkpointing, TrainState, empty_history, run_loop
from numpy_engine.models import (
    GPT2,
    GPT2Config,
    GPTConfig,
    MiniGPT,
    Seq2SeqConfig,
    Seq2SeqTransformer,
)
from numpy_engine.optim import AdamW
from numpy_engine.parallel import DataParallel, OneProcess
from numpy_engine.step_memory import STEP_OVERHEAD_BYTES, check_step_fits, step_bytes
from numpy_engine.tasks import sequence_task

# Counted over measured, at most: the count is generous (a layer's activations are counted
# as if every cache of it lived at once), but a run that fits must not be refused for it.
# Over 400 random draws of the final count, beyond its fixed allowance: 1.23-4.8; another 400
# drew one at 5.4 (a seq2seq model of d_model 8 and d_ff 512 on sources of 64).
GENEROUS_AT_MOST = 8.0


DROPOUT_RATES = ("embed_dropout", "attn_dropout", "resid_dropout")


def copy_model(sizes: dict, layers: int | tuple[int, int], length: int, dtype: str):
    """layers: for both stacks, or (encoder's, decoder's)."""
    encoder, decoder = layers if isinstance(layers, tuple) else (layers, layers)
    config = Seq2SeqConfig(**sizes, n_encoder_layers=encoder, n_decoder_layers=decoder, dtype=dtype)
    return Seq2SeqTransformer(config, seed=0), SequenceTrainConfig


def minigpt(sizes: dict, layers: int, length: int, dtype: str):
    config = GPTConfig(**sizes, n_layers=layers, max_len=length, dtype=dtype)
    return MiniGPT(config, seed=0), CharTrainConfig


def gpt2(sizes: dict, layers: int, length: int, dtype: str):
    config = GPT2Config(**sizes, n_layers=layers, max_len=length, dtype=dtype)
    return GPT2(config, seed=0), CharTrainConfig


@st.composite
def runs(draw) -> tuple:
    """(model, its run's config, length, a batch, parallel or None), the sizes drawn from
    where one term of the count is most of it (a vocabulary of thousands, wide layers,
    long sequences) to where none is."""
    n_heads = draw(st.integers(1, 4))
    sizes = dict(
        vocab_size=draw(st.sampled_from([5, 40, 300, 3000])),
        d_model=n_heads * draw(st.sampled_from([2, 8, 32, 64])),
        n_heads=n_heads,
        d_ff=draw(st.sampled_from([4, 64, 512])),
    )
    build = draw(st.sampled_from([copy_model, minigpt, gpt2]))
    if build is not copy_model:  # dropout's masks, kept for the backward, at every site
        sizes |= dict.fromkeys(DROPOUT_RATES, draw(st.sampled_from([0.0, 0.1])))
    length = draw(st.sampled_from([2, 3, 16, 64]))  # a language model's 1 would have no target
    dtype = draw(st.sampled_from(["float32", "float64"]))
    layers, accumulate = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    batch_size = accumulate * draw(st.sampled_from([1, 3, 8]))
    return run_of(build, sizes, layers, length, dtype, batch_size, accumulate)


def run_of(build, sizes: dict, layers: int, length: int, dtype, batch_size: int, accumulate):
    model, run_config = build(sizes, layers, length, dtype)
    batch = model.example_batch(model.config, np.random.default_rng(1), batch_size, length)
    parallel = DataParallel(OneProcess(), accumulate) if accumulate > 1 else None
    return model, run_config(batch_size=batch_size), length, batch, parallel


# The draw that the count missed by 6% before it held the reduced gradient's scratch (as large
# as the embedding here) and before a step over micro-batches let go of each one's gradients
# before the next one's were made
WIDE_VOCABULARY_IN_MICRO_BATCHES = run_of(
    copy_model, dict(vocab_size=3000, d_model=128, n_heads=2, d_ff=512), 2, 3, "float64", 6, 2
)


def first_steps_bytes(model, run_config, batch: tuple, parallel) -> int:
    """The most bytes allocated at once, above what was allocated before, while the run's
    optimizer is made and the training loop takes two steps."""
    model.loss_and_grads(*batch)  # what the first step keeps for later (a causal limit)

    def first_steps() -> None:
        optimizer = run_config.optimizer(model.params)
        state = TrainState(model, optimizer, np.random.default_rng(0), 0, empty_history(False))
        steps = replace(run_config, steps=2)
        run_loop(state, steps, lambda sampler: batch, None, None, None, lambda state: {}, parallel)

    return peak_bytes(first_steps)


def peak_bytes(work) -> int:
    """The most bytes allocated at once while work() runs, above what was allocated before."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        work()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@given(run=runs())
@example(run=WIDE_VOCABULARY_IN_MICRO_BATCHES)
def test_a_runs_steps_take_no_more_memory_than_its_check_counts(run):
    model, run_config, length, batch, parallel = run
    counted = step_bytes(model, run_config, length, None, parallel)
    measured = first_steps_bytes(model, run_config, batch, parallel)
    assert measured <= counted
    assert counted <= GENEROUS_AT_MOST * measured + STEP_OVERHEAD_BYTES


def test_the_count_holds_each_parameter_sized_vector_a_run_adds():
    """The gradients always; the optimizer's moments (AdamW: 2) unless a resumed run has
    them; the reduced gradient of a step over micro-batches (or ranks) and its scratch, the
    size of the largest parameter, while a forward then takes a micro-batch's rows. On
    GPT-2 (124M parameters) the moments alone are 1 GB: a check of the activations alone
    let a run start that the first update could not hold."""
    model, run_class = minigpt(dict(vocab_size=5, d_model=8, n_heads=2, d_ff=4), 1, 4, "float64")
    run_config, P, itemsize = run_class(batch_size=6), model.flat.size, 8
    new = step_bytes(model, run_config, 4, None)
    activations = MiniGPT.step_values(model.config, 6, 4)
    assert new == (activations + 3 * P) * itemsize + STEP_OVERHEAD_BYTES
    state = TrainState(model, run_config.optimizer(model.params), np.random.default_rng(0))
    assert step_bytes(model, run_config, 4, state) == new - 2 * P * itemsize
    assert step_bytes(model, run_config, 4, None, DataParallel(OneProcess())) == new
    micro_batches = DataParallel(OneProcess(), accumulate=2)  # 3 rows a forward
    largest = 8 * 8  # each of the attention's four projection weights
    fewer_rows = MiniGPT.step_values(model.config, 3, 4) - activations
    more = (P + largest + fewer_rows) * itemsize
    assert step_bytes(model, run_config, 4, None, micro_batches) == new + more


def test_a_step_over_micro_batches_adds_the_reduced_gradient_and_one_parameter_sized_scratch():
    """What a step over micro-batches adds, measured, to a plain step on one micro-batch's
    rows: the reduced vector (P + 3 entries) and the scratch each n x gradient is made in,
    as large as the largest parameter (here the 3000-word embedding, under a quarter of P).
    A scratch of P entries fits the count's slack on this model, but on a 124M GPT-2 in
    float32 it would be 85.8M entries (343 MB) more."""
    sizes = dict(vocab_size=3000, d_model=128, n_heads=2, d_ff=512)
    model, run_config, _, batch, parallel = run_of(copy_model, sizes, 2, 3, "float64", 6, 2)
    plain_model, plain_config, _, plain_batch, _ = run_of(copy_model, sizes, 2, 3, "float64", 3, 1)
    in_micro_batches = first_steps_bytes(model, run_config, batch, parallel)
    added = in_micro_batches - first_steps_bytes(plain_model, plain_config, plain_batch, None)
    largest = max(p.size for p in model.params.values())
    expected = (model.flat.size + 3 + largest) * 8
    assert expected <= added <= expected + 256 * 1024, (added, expected)


def test_the_loop_lets_go_of_a_steps_gradients_before_the_next_step_makes_its_own(monkeypatch):
    """Held by the loop until the next step had made its own, a step's gradients were a second
    parameter-sized set at every step's peak, which the count does not hold: `train lm
    --init` of a 124M GPT-2 peaked at 2765 MB with them, 2275 without (measured)."""
    model, run_class = minigpt(dict(vocab_size=5, d_model=8, n_heads=2, d_ff=4), 1, 4, "float64")
    batch = model.example_batch(model.config, np.random.default_rng(1), 2, 4)
    made, alive_when_making = [], []
    loss_and_grads = model.loss_and_grads

    def recorded(*batch):
        alive_when_making.append(sum(made_before() is not None for made_before in made))
        loss, grads = loss_and_grads(*batch)
        made.extend(weakref.ref(grad) for grad in grads.values())
        return loss, grads

    monkeypatch.setattr(model, "loss_and_grads", recorded)
    run_config = run_class(batch_size=2, steps=3)
    optimizer = run_config.optimizer(model.params)
    state = TrainState(model, optimizer, np.random.default_rng(0), 0, empty_history(False))
    run_loop(state, run_config, lambda sampler: batch, None, None, None, lambda state: {})
    assert state.step == 3 and len(made) == 3 * len(model.params)
    assert alive_when_making == [0, 0, 0]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_run_is_refused_exactly_when_its_steps_bytes_exceed_what_is_available(monkeypatch, dtype):
    model, run_config = minigpt(dict(vocab_size=5, d_model=8, n_heads=2, d_ff=4), 1, 32, dtype)
    run_config = run_config(batch_size=8)
    needed = step_bytes(model, run_config, 32, None)
    monkeypatch.setattr(memory, "available_bytes", lambda: needed)
    check_step_fits("a char-lm run", model, run_config, 32, None)  # just fits
    monkeypatch.setattr(memory, "available_bytes", lambda: needed - 1)
    with pytest.raises(ValueError, match=r"^a char-lm run \(256 tokens a step\) would need"):
        check_step_fits("a char-lm run", model, run_config, 32, None)


def new_char_lm_run():
    """(run config, the model train_char_lm makes for it, its length, its trainer)."""
    run_config = CharTrainConfig(steps=1, batch_size=8)
    vocab_size = len(set(train.DEFAULT_TEXT))  # a new model's vocabulary: the text's
    model = train._new_language_model(run_config, vocab_size)
    return run_config, model, run_config.context, train.train_char_lm


def new_copy_run():
    """The same for train_sequence_task."""
    run_config = SequenceTrainConfig(steps=1, batch_size=8)
    model = Seq2SeqTransformer(Seq2SeqConfig(), seed=run_config.seed)
    length = sequence_task("copy", seed=run_config.seed).train.source.shape[1]
    return run_config, model, length, train.train_sequence_task


@pytest.mark.parametrize(
    "new_run, said",
    [
        (new_char_lm_run, r"^batch_size=8 with context=32 \(256 tokens a step\) would need"),
        (new_copy_run, r"^batch_size=8 \(24 tokens a step\) would need"),
    ],
)
def test_a_new_run_is_checked_with_its_optimizers_moments(monkeypatch, new_run, said):
    """A task checks a run before its first step, counting a new run's moments (it has no
    state yet): refused with one byte less than that count, run with it."""
    run_config, model, length, trainer = new_run()
    needed = step_bytes(model, run_config, length, None)
    monkeypatch.setattr(memory, "available_bytes", lambda: needed - 1)
    with pytest.raises(ValueError, match=said):
        trainer(run_config, progress_stream=None)
    monkeypatch.setattr(memory, "available_bytes", lambda: needed)
    assert trainer(run_config, progress_stream=None).result["steps"] == 1


class TwoRanksOnOneMachine(OneProcess):
    """A group whose two ranks share this machine's memory (MPIGroup's ranks_on_this_node)."""

    ranks_on_this_node = 2


def test_ranks_that_share_a_machine_are_refused_when_their_steps_together_exceed_it(monkeypatch):
    model, run_config = minigpt(dict(vocab_size=5, d_model=8, n_heads=2, d_ff=4), 1, 32, "float32")
    run_config = run_config(batch_size=8)
    parallel = DataParallel(TwoRanksOnOneMachine())
    each = step_bytes(model, run_config, 32, None, parallel)
    monkeypatch.setattr(memory, "available_bytes", lambda: 2 * each)
    check_step_fits("a char-lm run", model, run_config, 32, None, parallel)  # just fits
    monkeypatch.setattr(memory, "available_bytes", lambda: 2 * each - 1)  # one rank's would fit
    said = r"^a char-lm run \(256 tokens a step on each of 2 ranks on this machine\) would need"
    with pytest.raises(ValueError, match=said):
        check_step_fits("a char-lm run", model, run_config, 32, None, parallel)


def test_a_checkpoint_is_written_from_the_moments_and_read_into_them_without_copies(tmp_path):
    """A run's checkpoint holds the optimizer's two moments. Copied first, they were twice
    the parameters' bytes more at every save (1 GB on GPT-2, past what a step takes), and
    copied again when a resumed run's state was checked against them."""
    model, _ = minigpt(dict(vocab_size=300, d_model=64, n_heads=2, d_ff=256), 2, 16, "float64")
    optimizer = AdamW(model.params)
    for vector in optimizer.flat_state.values():
        vector[...] = np.random.default_rng(0).random(vector.size)
    state = TrainState(model, optimizer, np.random.default_rng(0))
    checkpointing = Checkpointing(tmp_path / "run", every=1)
    checkpointing.make_directory()
    saved = peak_bytes(lambda: loop._save(state, checkpointing, lambda state: {}))
    assert saved < model.flat.nbytes / 4  # each moment takes model.flat.nbytes
    moments = load_checkpoint(tmp_path / "run").optimizer_state
    assert moments.keys() == optimizer.state_dict().keys()
    live = optimizer.state_arrays()
    for key, value in moments.items():
        assert np.array_equal(value, live[key]) and not np.shares_memory(value, live[key])
    optimizer.flat_state["exp_avg"][...] = 0.0
    assert peak_bytes(lambda: optimizer.load_state_dict(moments)) < model.flat.nbytes / 4
    for name, vector in optimizer.flat_state.items():  # read back into the live vectors
        assert np.array_equal(
            vector, np.concatenate([moments[f"{name}.{key}"].ravel() for key in model.params])
        )


def counted_and_measured_bytes(
    build, sizes: dict, layers, length: int, rows: int
) -> tuple[int, int]:
    """(counted, measured) bytes of a float32 run of one process, batches of `rows` rows."""
    model, run_config, length, batch, _ = run_of(build, sizes, layers, length, "float32", rows, 1)
    measured = first_steps_bytes(model, run_config, batch, None)
    return step_bytes(model, run_config, length, None), measured


@pytest.mark.parametrize("build", [copy_model, minigpt, gpt2])
@pytest.mark.parametrize(
    "sizes, larger",
    [
        (dict(layers=1, vocab_size=300, d_model=256, rows=1, length=2), dict(layers=3)),
        (dict(layers=1, vocab_size=3000, d_model=64, rows=1, length=2), dict(vocab_size=30000)),
        (dict(layers=1, vocab_size=3000, d_model=16, rows=1, length=16), dict(rows=8)),
        (dict(layers=1, vocab_size=5, d_model=2, rows=1, length=16), dict(length=128)),
        (dict(layers=1, vocab_size=5, d_model=64, rows=1, length=2), dict(d_ff=2048)),
    ],
    ids=["layers", "vocabulary", "rows", "length", "d_ff"],
)
def test_what_a_larger_model_or_batch_takes_more_is_counted_more(build, sizes, larger):
    """The count's slack at one size could hide a term it lacks, which a larger model or
    batch would then miss by more and more: so what two sizes' steps take apart is counted
    apart too, at least. Per layer (d_model 256, two positions), its weights and the copies
    a step keeps and makes of them; per word (past where the embedding outweighs a block),
    its embedding and readout rows and their copies; per row of a batch over 3,000 words,
    its logits; per position of a narrow model, its attention scores, which grow with the
    square of the length; per unit of a wider FFN, its weights and their copies."""

    def counted_and_measured(given: dict) -> tuple[int, int]:
        model_sizes = dict(
            vocab_size=given["vocab_size"],
            d_model=given["d_model"],
            n_heads=2,
            d_ff=given.get("d_ff", 64),
        )
        return counted_and_measured_bytes(
            build, model_sizes, given["layers"], given["length"], given["rows"]
        )

    counted, measured = counted_and_measured(sizes)
    counted_larger, measured_larger = counted_and_measured(sizes | larger)
    assert measured_larger - measured <= counted_larger - counted


@pytest.mark.parametrize("deeper", [(3, 1), (1, 3)], ids=["encoder", "decoder"])
def test_what_a_deeper_encoder_or_decoder_takes_more_is_counted_more(deeper):
    """As above, for the copy model's two stacks apart: a decoder layer keeps more stacked
    weights (its cross-attention's keys and values too) than an encoder layer does. Eight
    rows of 16 positions, so that the layers' activations count too."""
    sizes = dict(vocab_size=40, d_model=128, n_heads=2, d_ff=64)
    counted, measured = counted_and_measured_bytes(copy_model, sizes, (1, 1), 16, 8)
    counted_deeper, measured_deeper = counted_and_measured_bytes(copy_model, sizes, deeper, 16, 8)
    assert measured_deeper - measured <= counted_deeper - counted


@pytest.mark.parametrize("build", [copy_model, minigpt, gpt2])
@pytest.mark.parametrize(
    "length, rows, d_model, n_heads", [(32, 8, 64, 2), (16, 8, 128, 2), (64, 4, 16, 4)]
)
def test_what_dropout_takes_more_is_counted_more_and_not_much_more(
    build, length, rows, d_model, n_heads
):
    """A step with dropout keeps a mask per site for its backward: what that adds is
    counted, at least, and at most half as much again (measured 1.04-1.25 of it), where the
    masks are most of the difference (a small vocabulary, long rows, two layers)."""
    sizes = dict(vocab_size=5, d_model=d_model, n_heads=n_heads, d_ff=64)
    counted, measured = counted_and_measured_bytes(build, sizes, 2, length, rows)
    dropping = sizes | dict.fromkeys(DROPOUT_RATES, 0.1)
    counted_dropping, measured_dropping = counted_and_measured_bytes(
        build, dropping, 2, length, rows
    )
    more = measured_dropping - measured
    assert more <= counted_dropping - counted <= 1.5 * more


@pytest.mark.parametrize("layers", [(3, 1), (1, 3)], ids=["encoder", "decoder"])
def test_what_dropout_takes_more_in_either_stack_is_counted_more(layers):
    """As above, for the copy model's stacks apart: an encoder layer keeps its one
    attention's masks and two outputs', a decoder layer its two attentions' and three."""
    sizes = dict(vocab_size=5, d_model=32, n_heads=4, d_ff=64)
    counted, measured = counted_and_measured_bytes(copy_model, sizes, layers, 32, 8)
    dropping = sizes | dict.fromkeys(DROPOUT_RATES, 0.1)
    counted_dropping, measured_dropping = counted_and_measured_bytes(
        copy_model, dropping, layers, 32, 8
    )
    more = measured_dropping - measured
    assert more <= counted_dropping - counted <= 1.5 * more


@pytest.mark.parametrize("build", [copy_model, minigpt, gpt2])
def test_a_model_reads_its_weights_one_at_a_time_and_each_once(build):
    """read_params (checkpoints, import-hf) reads a weight only once the last one read is
    gone, and each weight once, in the model's order, after checking the keys it is given."""
    model, _ = build(dict(vocab_size=7, d_model=8, n_heads=2, d_ff=4), 2, 4, "float64")
    read, alive_when_reading = [], []

    def weight(key: str) -> np.ndarray:
        alive_when_reading.append(sum(earlier() is not None for _, earlier in read))
        value = model.params[key].copy()
        read.append((key, weakref.ref(value)))
        return value

    taken, *first_keys, last = type(model).unwritten(model.config), *model.params
    with pytest.raises(ValueError, match=re.escape(f"params: missing keys ['{last}']")):
        taken.read_params(first_keys, weight)
    assert read == []
    taken.read_params(list(model.params)[::-1], weight)
    assert [key for key, _ in read] == list(model.params)
    assert alive_when_reading == [0] * len(model.params)
    np.testing.assert_array_equal(taken.flat, model.flat)
