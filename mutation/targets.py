"""What `python -m mutation` breaks, and which tests must notice: by default the engine's
backward code, from each layer's gradient to the models' and the optimizer's; with --code
forward, the forward code those gradients are taken of, from each layer to decoding."""

from __future__ import annotations

BACKWARD_CODE = {
    "numpy_engine/layers.py": (
        "linear_backward",
        "input_affine_grads",
        "_folded_backward",
        "unstacked",
        "embedding_backward",
        "embedding_row_grads",
        "learned_positions_backward",
        "ffn_backward",
    ),
    "numpy_engine/layernorm.py": ("layernorm_backward", "normalize_backward"),
    "numpy_engine/activations.py": (
        "relu_backward",
        "gelu_backward",
        "_gelu_block",  # the forward's chain computes the derivative too
        "_gelu_slope",
    ),
    "numpy_engine/softmax.py": ("softmax_backward",),
    "numpy_engine/attention.py": (
        "attention_backward",
        "_group_backward",
        "_groups_backward",
        "_blocks_backward",
        "_head_blocks_backward",
        "scaled_row_dots",
    ),
    "numpy_engine/multihead.py": (
        "self_attention_backward",
        "cross_attention_backward",
    ),
    "numpy_engine/losses.py": (
        "cross_entropy_forward",
        "cross_entropy_backward",
        "_counted_targets",
        "_shifted_by_row_max",
        "_other_classes_mass",
        "_minus_the_rest",
        "linear_cross_entropy",
        "_dlogits_in_place",
    ),
    "numpy_engine/blocks.py": (
        "normed_backward",
        "self_attention_block_backward",
        "decoder_block_backward",
    ),
    "numpy_engine/reductions.py": (
        "sum_leading",
        "sum_last",
        "_last_times",
        "dot_last",
        "mean_last",
    ),
    "numpy_engine/clipping.py": (
        "clip_grad_norm",
        "global_norm",
        "norm_of_blocks",
        "_block_squares",
        "_squares",
        "clip_coefficient",
        "Gradients.block",
        "in_thread_runs",
    ),
    "numpy_engine/optim.py": (
        "Optimizer.step",
        "Optimizer._scratches",
        "SGD._update_block",
        "Adam._step_constants",
        "Adam._l2_term",
        "Adam._update_block",
        "AdamW._update_block",
    ),
    "numpy_engine/threads.py": (  # the optimizer's runs of blocks, attention's pieces
        "in_chunks",
        "chunk_count",
        "in_chunks_alone",
        "_only_the_engines_threads",
    ),
    "numpy_engine/blas_threads.py": ("openblas", "library_paths", "_first", "alone"),
    "numpy_engine/dropout.py": ("Dropout.mask", "dropped", "dropped_copy", "training_rng"),
    "numpy_engine/models/seq2seq.py": ("_backward", "_decode_backward", "_encode_backward"),
    "numpy_engine/models/minigpt.py": (
        "_backward",
        "_trunk_backward",
        "_loss_and_grads",
        "_head_and_embedding_grads",
    ),
    "numpy_engine/models/gpt2.py": ("_head_and_embedding_grads",),
}

FORWARD_CODE = {
    "numpy_engine/layers.py": (
        "linear_forward",
        "_folded_forward",
        "stacked",
        "embedding_forward",
        "sinusoidal_table",
        "sinusoidal_forward",
        "learned_positions_forward",
        "ffn_forward",
    ),
    "numpy_engine/layernorm.py": ("layernorm_forward", "normalize_forward"),
    "numpy_engine/activations.py": (
        "relu_forward",
        "gelu_forward",
        "_gelu_block",
        "_gelu_output_block",
        "_exp_minus_2u",
    ),
    "numpy_engine/masks.py": (
        "padding_visible",
        "causal_visible",
        "check_every_row_sees_a_key",
        "hidden_scores",
        "is_shared_causal",
        "hidden_limit",
    ),
    "numpy_engine/softmax.py": ("softmax_last",),
    "numpy_engine/attention_blocks.py": (
        "batch_groups",
        "query_blocks",
        "_kept_share",
        "_key_stops",
        "pieces_of",
        "piece",
    ),
    "numpy_engine/attention.py": (
        "attention_forward",
        "scaled_transpose",
        "_weights",
        "_blocks_forward",
        "_groups_forward",
        "_head_blocks_forward",
        "_mask_block",
    ),
    "numpy_engine/multihead.py": (
        "split_heads",
        "heads_buffer",
        "_qkv",
        "self_attention_forward",
        "memory_keys_values",
        "cross_attention_forward",
    ),
    "numpy_engine/blocks.py": (
        "normed",
        "_residual",
        "self_attention_block_forward",
        "decoder_block_forward",
    ),
    "numpy_engine/blocking.py": ("slices", "in_row_blocks"),
    "numpy_engine/models/base.py": ("readout_last",),
    "numpy_engine/params.py": (  # where training starts (test_init.py)
        "linear_params",
        "attention_params",
        "ffn_params",
        "self_block_params",
        "decoder_block_params",
    ),
    "numpy_engine/models/gpt2.py": ("GPT2._init_params",),
    "numpy_engine/models/seq2seq.py": (
        "Seq2SeqTransformer._init_params",
        "Seq2SeqTransformer.encode",
        "Seq2SeqTransformer.decode",
        "CachedSeq2SeqDecoder._run",
    ),
    "numpy_engine/models/minigpt.py": (
        "normal_init",
        "trunk_params",
        "MiniGPT._init_params",
        "MiniGPT.forward",
        "MiniGPT._trunk_forward",
        "CachedGPTDecoder._run",
    ),
    "numpy_engine/generate.py": (
        "greedy_decode",
        "next_token_probabilities",
        "sample_next",
        "generate",
    ),
}

CODE = {"backward": BACKWARD_CODE, "forward": FORWARD_CODE}

# The tests that check the engine's numbers, and its refusals (each mutant runs them with -x: the
# first failure kills it). The command line, training and MPI tests are left out: they check
# other things, slowly. A mutated file's own test file (parity_tests/test_<its name>.py) is
# always here (test_mutation.py checks it).
NUMBER_TESTS = (
    "parity_tests/test_reductions.py",
    "parity_tests/test_bad_input.py",  # the guards in this code: each refusal and its message
    "parity_tests/test_malformed_input.py",  # the same guards, against drawn input
    "parity_tests/test_semantics.py",
    "parity_tests/test_models.py",
    "parity_tests/test_optim.py",
    "parity_tests/test_clipping.py",
    "parity_tests/test_optimizer_threads.py",
    "parity_tests/test_mechanisms.py",
    "parity_tests/test_kvcache.py",
    "parity_tests/test_generate.py",
    "parity_tests/test_model_contract.py",
    "parity_tests/test_layers.py",
    "parity_tests/test_layer_paths.py",
    "parity_tests/test_query_blocks.py",
    "parity_tests/test_attention_threads.py",
    "parity_tests/test_activations.py",
    "parity_tests/test_gpt2.py",
    "parity_tests/test_models_fd.py",
    "parity_tests/test_float32.py",
    "parity_tests/test_trajectory.py",
    "parity_tests/test_hf_interchange.py",
    "parity_tests/test_hf_shards.py",
    "parity_tests/test_hf_tokenizer.py",
    "parity_tests/test_tokenizer_text.py",
    "parity_tests/test_init.py",
    "parity_tests/test_example_batches.py",
    "parity_tests/test_step_memory.py",
    "parity_tests/test_read_memory.py",
    "parity_tests/test_dropout.py",
    "parity_tests/test_threads.py",
    "parity_tests/test_blas_threads.py",
)


def code_targets(code: str) -> list[tuple[str, str]]:
    """(file, function) of each function of CODE[code] ("backward" or "forward")."""
    return [(path, name) for path, names in CODE[code].items() for name in names]
