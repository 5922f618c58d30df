"""A GGUF file converted once into an mlx-lm model directory under mlxspec's cache, keyed by the file's hash.

The weights keep their own bits (weights.py): quantized blocks become MLX's affine format, exactly where the block
type allows, and the conversion says per type what it did; llama.cpp's per-architecture transforms are undone
(architectures.py). The tokenizer is rebuilt from the file's own metadata
(tokens, scores, types, merges, special ids, chat template) by transformers' GGUF tokenizer builders, which need no
torch. A finished conversion is marked by its `gguf_source.json`; an interrupted one is started over.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

from mlxspec.errors import UserError
from mlxspec.gguf.architectures import END_OF_TURN, architecture_of, mlx_config
from mlxspec.gguf.blocks import GROUP
from mlxspec.gguf.header import Header, read_header
from mlxspec.gguf.validate import check_convertible, embedding_rows
from mlxspec.gguf.weights import converted_tensors
from mlxspec.k_quants import CONFIG_KEY as K_QUANTS_KEY
from mlxspec.platform import cache_dir

MARKER = "gguf_source.json"  # written last: a directory without it is an interrupted conversion
CONVERSION_FORMAT = 4  # in the marker; a conversion made by another format is made anew
TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
TOKENIZER_ARRAYS += ("tokenizer.ggml.merges",)


def file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def converted_dir(path: Path, say=None) -> Path:
    """The mlx-lm directory for the GGUF at `path`, converting it the first time (progress and where it went on
    stderr, through `say`)."""
    say = say or (lambda line: print(f"mlxspec: {line}", file=sys.stderr, flush=True))
    path = Path(path)
    header = read_header(path)  # refuses a damaged file or an unknown architecture before hashing 4 GB
    architecture_of(header)
    digest = file_hash(path)
    out = cache_dir() / "gguf" / f"{path.stem}-{digest[:16]}"
    if is_conversion_of(out, digest):
        return out
    return convert_once(path, out, digest, say)


def is_conversion_of(out: Path, digest: str) -> bool:
    """Whether `out` holds a finished conversion of the file whose sha256 is `digest` (its marker, written last,
    names it): a folder with only a config.json, or another file's conversion, is not one."""
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("format") != CONVERSION_FORMAT:
        return False
    return marker.get("sha256") == digest and (out / "config.json").is_file()


def convert_once(path: Path, out: Path, digest: str, say) -> Path:
    """Convert into a private folder, then rename it into place, under a lock: processes converting the same
    file at once wait for the first, and none deletes another's work."""
    import fcntl
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if is_conversion_of(out, digest):  # another process finished it while this one waited
            return out
        for stale in out.parent.glob(out.name + ".partial*"):  # left by a conversion that died: the lock is ours
            shutil.rmtree(stale, ignore_errors=True)
        start = time.perf_counter()
        header = read_header(path)
        say(f"converting {path.name} ({header.architecture}, {len(header.tensors)} tensors) once")
        work = Path(tempfile.mkdtemp(prefix=out.name + ".partial-", dir=out.parent))
        try:
            weights = write_model(path, work, say)
            marker = {"gguf": str(path), "sha256": digest, "format": CONVERSION_FORMAT, "weights": weights}
            (work / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
            work.chmod(0o755)  # mkdtemp's folder is private to this user; a conversion is not
            shutil.rmtree(out, ignore_errors=True)
            work.rename(out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    say(f"converted {path.name} in {time.perf_counter() - start:.0f} s into {out}; later runs read it from there")
    return out


def write_model(path: Path, out: Path, say) -> str:
    """Write the model into `out`; the one-line summary of what became of each block type."""
    header = read_header(path, TOKENIZER_ARRAYS)
    arch = architecture_of(header)
    check_convertible(header)
    tokenizer = write_tokenizer(header, out)
    vocab = embedding_rows(header)
    eos = header.metadata.get("tokenizer.ggml.eos_token_id")
    ends = [tokenizer.convert_tokens_to_ids(name) for name in END_OF_TURN if name in tokenizer.get_vocab()]
    eos_ids = sorted({i for i in [eos, *ends] if isinstance(i, int)})
    config = mlx_config(header, arch, vocab, eos_ids)
    converted = converted_tensors(header, arch, config)
    for type_name, report in sorted(converted.report.items()):
        say(report.line(type_name))
    if converted.layers or converted.k_quants:
        # a K-quant layer is built by mlxspec (k_quants.attach), not quantized by mlx-lm
        factored = {path: False for path in converted.k_quants}
        config["quantization"] = {"group_size": GROUP, "bits": 4, "mode": "affine", **converted.layers, **factored}
    if converted.k_quants:
        config[K_QUANTS_KEY] = converted.k_quants
    import mlx.core as mx

    arrays = {k: v if isinstance(v, mx.array) else mx.array(v) for k, v in converted.arrays.items()}
    mx.save_safetensors(str(out / "model.safetensors"), arrays)
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return converted.summary()


def write_tokenizer(header: Header, out: Path):
    """The tokenizer the file's metadata describes, saved as tokenizer.json and tokenizer_config.json."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        add_gguf_special_tokens,
        select_tokenizer_builder,
        set_split_regex,
    )

    meta = header.metadata
    fields = {
        name: meta[f"tokenizer.{key}"]
        for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{key}" in meta
    }
    try:
        builder = select_tokenizer_builder(header.architecture, fields.get("tokenizer_type"))
    except ValueError as error:
        raise UserError(f"'{header.path}': {error}") from None
    try:
        tokenizer = set_split_regex(add_gguf_special_tokens(builder(fields), fields), fields)
    except Exception as error:  # noqa: BLE001 (the builders' errors on odd vocabularies are of every kind)
        detail = " ".join(str(error).split())[:200]
        raise UserError(f"'{header.path}': its tokenizer cannot be built ({type(error).__name__}: {detail})") from None
    tokens = fields["tokens"]
    for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id")):
        index = meta.get(f"tokenizer.ggml.{key}")
        if isinstance(index, int) and 0 <= index < len(tokens):
            setattr(tokenizer, f"{role}_token", tokens[index])
    index = meta.get("tokenizer.ggml.padding_token_id")
    if isinstance(index, int) and 0 <= index < len(tokens):
        tokenizer.pad_token = tokens[index]
    tokenizer.add_bos_token = bool(meta.get("tokenizer.ggml.add_bos_token", fields.get("tokenizer_type") == "llama"))
    tokenizer.add_eos_token = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    template = meta.get("tokenizer.chat_template")
    template = template if isinstance(template, str) else architecture_of(header).chat_template
    if template:
        tokenizer.chat_template = template
    tokenizer.save_pretrained(str(out))
    return tokenizer
