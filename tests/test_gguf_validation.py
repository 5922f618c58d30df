"""Bad input, round four, rows 7 and 8 (issue 44): a GGUF file's header values and tokenizer arrays are checked
before conversion. Each bad file is refused in one line naming it; a property test writes random values into a tiny
model's header and tokenizer arrays and holds that conversion, and the first forward pass of what converts, never
gives a traceback."""

from __future__ import annotations

import random

import numpy as np
import pytest
from test_gguf import TOKENS, tiny, write_gguf

from mlxspec.errors import UserError
from mlxspec.gguf.convert import converted_dir


@pytest.fixture(scope="module")
def models():
    return {family: tiny(family) for family in ("qwen3", "gemma3_text", "llama")}


def written(tmp_path, model, family, edit=None, name="m.gguf"):
    """A tiny model's GGUF, with `edit(writer)` applied before it is written."""
    import gguf

    original = gguf.GGUFWriter.write_header_to_file

    def write_header(writer, *args, **kwargs):
        if edit is not None:
            edit(writer)
        return original(writer, *args, **kwargs)

    gguf.GGUFWriter.write_header_to_file = write_header
    try:
        return write_gguf(tmp_path / name, model, family)
    finally:
        gguf.GGUFWriter.write_header_to_file = original


def set_value(key, value, kind):
    def edit(writer):
        writer.add_key_value(key, value, kind)

    return edit


def set_array(key, values):
    def edit(writer):
        if key in writer.kv_data[0]:
            del writer.kv_data[0][key]
        writer.add_array(key, values)

    return edit


def drop(key):
    def edit(writer):
        writer.kv_data[0].pop(key, None)

    return edit


def retyped_tensor(name, shape=None, dtype=None):
    """Replace tensor `name` by zeros of `shape` (and raw ggml `dtype`)."""

    def edit(writer):
        import gguf

        infos = writer.tensors[0]
        info = infos[name]
        data = np.zeros(shape, np.float32) if dtype is None else np.zeros(shape, np.uint8)
        infos[name] = gguf.gguf_writer.TensorInfo(
            shape=data.shape if dtype is None else info.shape, dtype=dtype or gguf.GGMLQuantizationType.F32,
            nbytes=data.nbytes, tensor=data,
        )  # fmt: skip

    return edit


def refused(tmp_path, path, *fragments):
    with pytest.raises(UserError) as error:
        converted_dir(path, say=lambda line: None)
    message = str(error.value)
    assert "\n" not in message and str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_string_metadata_where_numbers_belong_is_refused(tmp_path, models):
    import gguf

    S = gguf.GGUFValueType.STRING
    for key, fragment in [
        ("qwen3.attention.layer_norm_rms_epsilon", "layer_norm_rms_epsilon is '1e-6'"),
        ("qwen3.rope.freq_base", "rope.freq_base is '1e-6'"),
        ("qwen3.context_length", "context_length is '1e-6'"),
    ]:
        path = written(tmp_path, models["qwen3"], "qwen3", set_value(key, "1e-6", S), name=f"{key}.gguf")
        refused(tmp_path, path, fragment)
    path = written(
        tmp_path, models["gemma3_text"], "gemma3_text", set_value("gemma3.attention.sliding_window", "512", S)
    )
    refused(tmp_path, path, "sliding_window is '512'")


def test_a_gemma3_file_with_fewer_than_six_blocks_is_refused(tmp_path, models):
    import gguf

    def edit(writer):
        writer.add_key_value("gemma3.block_count", 4, gguf.GGUFValueType.UINT32)
        for index in (4, 5):
            for name in [n for n in writer.tensors[0] if n.startswith(f"blk.{index}.")]:
                del writer.tensors[0][name]

    refused(tmp_path, written(tmp_path, models["gemma3_text"], "gemma3_text", edit), "gemma3 with 4 blocks")


def test_a_zero_dimensional_tensor_and_ragged_blocks_are_refused(tmp_path, models):
    import gguf

    path = written(tmp_path, models["qwen3"], "qwen3", retyped_tensor("output_norm.weight", ()), name="0d.gguf")
    refused(tmp_path, path, "tensor 'output_norm.weight' has shape []")

    def ragged(writer):  # a Q8_0 tensor whose rows are 48 values: not whole 32-value blocks (count % 32 == 0)
        infos = writer.tensors[0]
        data = np.zeros((2, 48 // 32 * 34 * 2), np.uint8)  # 96 values' worth of blocks, shaped as 2 rows of 48
        infos["output_norm.weight"] = gguf.gguf_writer.TensorInfo(
            shape=(2, 48), dtype=gguf.GGMLQuantizationType.Q8_0, nbytes=data.nbytes, tensor=data
        )

    path = written(tmp_path, models["qwen3"], "qwen3", ragged, name="ragged.gguf")
    with pytest.raises(UserError) as error:
        converted_dir(path, say=lambda line: None)
    assert "\n" not in str(error.value) and ("48 values" in str(error.value) or "runs past" in str(error.value))


@pytest.mark.parametrize(
    "edit, fragment",
    [
        (set_array("tokenizer.ggml.tokens", list(range(len(TOKENS)))), "holds int"),
        (set_array("tokenizer.ggml.tokens", ["a"] * len(TOKENS)), "only 1 distinct strings"),
        (set_array("tokenizer.ggml.tokens", TOKENS[:10]), "10 tokens but its embedding 16 rows"),
        (set_array("tokenizer.ggml.scores", [0.0] * 3), "tokenizer.ggml.scores must be 16 finite numbers"),
        (set_array("tokenizer.ggml.token_type", [9] * len(TOKENS)), "token types 0..6"),
        (drop("tokenizer.ggml.tokens"), "carries no tokenizer"),
    ],
    ids=["int-tokens", "equal-tokens", "short-vocabulary", "short-scores", "bad-types", "no-tokens"],
)
def test_bad_tokenizer_arrays_are_refused(tmp_path, models, edit, fragment):
    refused(tmp_path, written(tmp_path, models["llama"], "llama", edit), fragment)


def test_a_tokenizer_of_100_tokens_over_2048_embedding_rows_is_refused(tmp_path):
    """Row 8: accepted before, and every prompt became <unk>."""
    from tiny import make_tiny

    wide = make_tiny("llama", seed=3, vocab_size=2048, num_hidden_layers=1)
    tokens = [f"t{i}" for i in range(100)]
    edit = [set_array("tokenizer.ggml.tokens", tokens), set_array("tokenizer.ggml.scores", [0.0] * 100)]
    edit.append(set_array("tokenizer.ggml.token_type", [1] * 100))
    path = written(tmp_path, wide, "llama", lambda writer: [e(writer) for e in edit])
    refused(tmp_path, path, "100 tokens but its embedding 2048 rows")


@pytest.mark.parametrize(
    "merges, fragment",
    [(None, "has no tokenizer.ggml.merges"), (["a b c", "ab"], "not a 'left right' pair"), ([1, 2], "not a 'left")],
)
def test_gpt2_merges_missing_or_malformed_are_refused(tmp_path, models, merges, fragment):
    import gguf

    def edit(writer):
        writer.add_key_value("tokenizer.ggml.model", "gpt2", gguf.GGUFValueType.STRING)
        writer.kv_data[0].pop("tokenizer.ggml.merges", None)
        if merges is not None:
            writer.add_array("tokenizer.ggml.merges", merges)

    refused(tmp_path, written(tmp_path, models["qwen3"], "qwen3", edit), fragment)


# ---- the property test ----

KEYS = [
    "attention.layer_norm_rms_epsilon",
    "rope.freq_base",
    "attention.sliding_window",
    "attention.key_length",
    "attention.head_count",
    "attention.head_count_kv",
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
]


def valid_values():
    import gguf

    T = gguf.GGUFValueType
    return [
        ("rope.freq_base", 500000.0, T.FLOAT32),
        ("attention.layer_norm_rms_epsilon", 1e-5, T.FLOAT32),
        ("context_length", 64, T.UINT32),
        ("attention.sliding_window", 16, T.UINT32),
    ]


VALID = valid_values()


def random_value(rng: random.Random):
    import gguf

    T = gguf.GGUFValueType
    return rng.choice(
        [
            ("1e-6", T.STRING),
            (rng.choice([0, 1, 2, 3, 6, 7, 2**31, 2**32 - 1]), T.UINT32),
            (rng.choice([-1, -(2**31)]), T.INT32),
            (rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e-30, 3.0]), T.FLOAT32),
            (True, T.BOOL),
            (2**63, T.UINT64),
        ]
    )


def random_array(rng: random.Random, length: int):
    return rng.choice(
        [
            list(range(length)),
            ["x"] * length,
            [f"t{i}" for i in range(rng.choice([0, 1, length - 1, length, length + 1]))] or ["t"],
            [float(i) for i in range(length)],
            [rng.random() for _ in range(rng.choice([length, 2]))],
            [True] * length,
            ["a b", "ab", "a  b", ""],
        ]
    )


@pytest.mark.slow
def test_random_header_values_and_tokenizer_arrays_never_give_a_traceback(tmp_path, models):
    """80 files, each with one to three random metadata values or tokenizer arrays: every one converts and runs a
    first forward pass, or is refused in one line naming the file. A traceback of any other kind fails."""
    import mlx.core as mx

    from mlxspec.loading import load_model

    rng = random.Random(7)
    outcomes = {"converted": 0, "refused": 0}
    messages = []
    arrays = ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"]
    for trial in range(80):
        family = rng.choice(["qwen3", "gemma3_text", "llama"])
        prefix = {"qwen3": "qwen3", "gemma3_text": "gemma3", "llama": "llama"}[family]
        edits = []
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.3:  # a valid value: files that differ and still convert
                key, value, kind = rng.choice(VALID)
                edits.append(set_value(f"{prefix}.{key}", value, kind))
            elif rng.random() < 0.6:
                edits.append(set_value(f"{prefix}.{rng.choice(KEYS)}", *random_value(rng)))
            else:
                edits.append(set_array(rng.choice(arrays), random_array(rng, len(TOKENS))))
        path = written(tmp_path, models[family], family, lambda w, e=edits: [f(w) for f in e], name=f"t{trial}.gguf")
        try:
            out = converted_dir(path, say=lambda line: None)
            model = load_model(out)
            mx.eval(model.model(mx.array([[1, 2, 3]])))
            outcomes["converted"] += 1
        except UserError as error:
            assert "\n" not in str(error), str(error)
            outcomes["refused"] += 1
            messages.append(str(error))
    assert outcomes["refused"] >= 20 and outcomes["converted"] >= 5, (outcomes, messages[:10])
