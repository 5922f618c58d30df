"""Drafters found, not guessed: what the local Hugging Face cache and mlxspec's cache `heads/` hold that can draft
for a target, read from metadata only (config files, tokenizer.json, safetensors headers), without downloading or
loading any weights.

In the order `--draft auto` prefers them:
1. a DFlash, EAGLE-3 or mlxspec EAGLE drafter made for this target: its hidden size, layer count and vocabulary
   match, and where it names a base model (speculators' verifier, our fingerprint) that names this target;
2. the target's own native MTP head, in its own files or in a cached original checkpoint of the same model;
3. a smaller model with the target's tokenizer, compared by content (vocabulary and special tokens);
4. prompt lookup, which needs nothing.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxspec.errors import UserError
from mlxspec.model_files import text_config

KIND_ORDER = ("dflash", "eagle3", "eagle", "mtp", "draft", "unreadable")
# What reading one cache entry may raise on a damaged or hostile file: it is skipped with a note, and the rest read.
ENTRY_ERRORS = (OSError, ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError, UserError)
SIDECAR_TYPES = ("qwen3_5_mtp",)  # mtp_weights.SIDECAR_TYPES, named here without importing MLX
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")


@dataclass
class Candidate:
    kind: str  # dflash, eagle3, eagle, mtp, draft
    source: str  # the repo id (or directory) to pass to the flag
    path: Path
    size_bytes: int
    matches: bool
    why: str
    named_for_target: bool = False  # its name or base model names this target, not only its sizes

    @property
    def flag(self) -> str:
        flags = {"dflash": "--dflash", "eagle3": "--eagle", "eagle": "--eagle", "mtp": "--mtp", "draft": "--draft"}
        return flags.get(self.kind, "")

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "source": self.source,
            "size_bytes": self.size_bytes,
            "matches": self.matches,
            "why": self.why,
        }


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads, read from the environment each time (tests point it elsewhere)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    try:
        from huggingface_hub.constants import HF_HUB_CACHE

        return Path(HF_HUB_CACHE)
    except ImportError:
        return Path.home() / ".cache" / "huggingface" / "hub"


def cached_snapshots(cache: Path | None = None, broken: list[tuple[str, Path, str]] | None = None):
    """(repo id, snapshot directory) of every cached model repo: the snapshot refs/main names, else the newest. An
    entry that cannot be read (a non-UTF-8 ref, a dangling or looping symlink) goes to `broken` as (repo, path, why)."""
    cache = cache or hub_cache_dir()
    found = []
    for repo_dir in sorted(cache.glob("models--*")):
        repo = repo_dir.name.removeprefix("models--").replace("--", "/")
        try:
            snapshot = _snapshot_of(repo_dir)
        except ENTRY_ERRORS as error:
            if broken is not None:
                broken.append((repo, repo_dir, _unreadable(error)))
            continue
        if snapshot is not None:
            found.append((repo, snapshot))
    return found


def local_heads() -> list[tuple[str, Path]]:
    """(directory, directory) of each drafter under mlxspec's cache `heads/`, where `train-heads --out` puts a head
    for a model of the user's own (models/recipes/gemma_head.sh puts the real Gemma's there)."""
    from mlxspec.platform import cache_dir

    try:
        return [(str(path), path) for path in sorted((cache_dir() / "heads").iterdir()) if path.is_dir()]
    except OSError:  # none yet
        return []


def _snapshot_of(repo_dir: Path) -> Path | None:
    ref = repo_dir / "refs" / "main"
    snapshot = repo_dir / "snapshots" / ref.read_text(encoding="utf-8").strip() if ref.is_file() else None
    if snapshot is None or not snapshot.is_dir():
        snapshots = sorted((repo_dir / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime)
        snapshot = snapshots[-1] if snapshots else None
    if snapshot is not None and snapshot.is_dir():
        snapshot.resolve(strict=True)  # a looping link fails here, by name, not later while reading it
        return snapshot
    return None


def _unreadable(error: Exception) -> str:
    reason = " ".join(str(error).split())[:100]
    return f"skipped: unreadable ({type(error).__name__}{': ' + reason if reason else ''})"


def weights_bytes(path: Path) -> int:
    return sum(f.stat().st_size for pattern in WEIGHT_GLOBS for f in path.glob(pattern) if f.exists())


def _int(value: Any) -> int:
    """A size read from a config someone else wrote: an int, or 0 (no match) for anything else."""
    return value if type(value) is int else 0


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def model_name(repo_or_dir: str) -> str:
    """A name to compare models by: the repo's last part, lowercased, without quantization and format suffixes."""
    name = repo_or_dir.rstrip("/").split("/")[-1].lower()
    return re.sub(r"(-(mlx|\d+bit|bf16|fp16|fp8|dwq|awq|gguf|instruct-\d+bit))+$", "", name)


def repo_of(path: Path) -> str:
    """The repo id of a path inside a Hugging Face cache snapshot (models--org--name/snapshots/<hash>), else ""."""
    for part in path.resolve().parts[::-1]:
        if part.startswith("models--"):
            return part.removeprefix("models--").replace("--", "/")
    return ""


@dataclass
class TargetFacts:
    """What matching needs to know of a target, from its directory's metadata."""

    path: Path
    name: str
    config: dict
    layers: int
    hidden: int
    vocab: int
    family: str
    size_bytes: int

    @functools.cached_property
    def vocabulary(self) -> tuple | None:
        """The target's tokenizer content, read once however many candidates are compared with it."""
        return _vocabulary_key(self.path)

    @classmethod
    def of(cls, path: Path, name: str = "") -> TargetFacts:
        config = _json(path / "config.json")
        own = text_config(config) if config else {}
        return cls(
            path=path,
            name=model_name(repo_of(path) or name or str(path)),
            config=config,
            layers=_int(own.get("num_hidden_layers")),
            hidden=_int(own.get("hidden_size")),
            vocab=_int(own.get("vocab_size")),
            family=str(own.get("model_type") or ""),
            size_bytes=weights_bytes(path),
        )


def _mismatch(facts: TargetFacts, **theirs: int) -> str:
    mine = {"layers": facts.layers, "hidden": facts.hidden, "vocab": facts.vocab}
    wrong = [f"{key} {value} (target: {mine[key]})" for key, value in theirs.items() if value != mine[key]]
    return ", ".join(wrong)


def _named_for(facts: TargetFacts, repo: str, drafter_suffixes: str) -> bool:
    """Whether a drafter repo's own name (z-lab/Qwen3-8B-DFlash-b16, yuhuili/EAGLE3-LLaMA3.1-Instruct-8B) names
    the target, compared without punctuation."""
    base = re.sub(drafter_suffixes, "", repo.split("/")[-1].lower())
    squash = lambda s: re.sub(r"[^a-z0-9]", "", s)  # noqa: E731
    return bool(base) and squash(base) in squash(facts.name)


def judge(repo: str, path: Path, facts: TargetFacts) -> Candidate | None:
    """The drafter at `path` judged against the target, or None if it is no drafter (nor a model)."""
    config = _json(path / "config.json")
    size = weights_bytes(path)
    if (path / "eagle_config.json").is_file():
        return _judge_own_eagle(repo, path, facts, size)
    if isinstance(config.get("dflash_config"), dict):
        wrong = _mismatch(
            facts,
            layers=_int(config.get("num_target_layers")),
            hidden=_int(config.get("hidden_size")),
            vocab=_int(config.get("vocab_size")),
        )
        named = _named_for(facts, repo, r"-dflash.*$")
        return Candidate("dflash", repo, path, size, not wrong, wrong or _sizes_match(named), named)
    if config.get("model_type") in SIDECAR_TYPES:
        return _judge_mtp_sidecar(repo, path, config, facts, size)
    if config.get("speculators_model_type") == "eagle3" or "draft_vocab_size" in config:
        return _judge_eagle3(repo, path, config, facts, size)
    if config.get("model_type") and (path / "tokenizer.json").is_file():
        return _judge_draft_model(repo, path, facts, size)
    return None


def _sizes_match(named: bool) -> str:
    return "layers, hidden size and vocabulary match" + ("; its name names this target" if named else "")


def _judge_mtp_sidecar(repo: str, path: Path, config: dict, facts: TargetFacts, size: int) -> Candidate:
    from mlxspec.drafting.heads.mtp_weights import LAYOUTS

    own = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    wrong = _mismatch(
        facts,
        layers=_int(own.get("num_hidden_layers")),
        hidden=_int(own.get("hidden_size")),
        vocab=_int(own.get("vocab_size")),
    )
    if not wrong and LAYOUTS.get(facts.family) is not LAYOUTS["qwen3_next"]:
        wrong = f"a {config['model_type']} sidecar, and the target is {facts.family}"
    why = wrong or "an MTP sidecar split from this model (layers, hidden size and vocabulary match)"
    return Candidate("mtp", repo, path, size, not wrong, why, not wrong)


def _judge_own_eagle(repo: str, path: Path, facts: TargetFacts, size: int) -> Candidate:
    from mlxspec.drafting.heads.files import base_model_identity

    config = _json(path / "eagle_config.json")
    identity = config.get("base_model_identity")
    ok = bool(identity) and (facts.path / "config.json").is_file() and identity == base_model_identity(facts.path)
    why = "trained on this target (fingerprint)" if ok else f"trained on '{config.get('base_model', '?')}'"
    return Candidate("eagle", repo, path, size, ok, why, ok)


def _judge_eagle3(repo: str, path: Path, config: dict, facts: TargetFacts, size: int) -> Candidate:
    from mlxspec.drafting.eagle3.files import default_aux_layers, parse_eagle3_config

    try:
        parsed = parse_eagle3_config(config, str(path / "config.json"))
    except UserError as error:
        return Candidate("eagle3", repo, path, size, False, str(error).split(";")[0])
    wrong = _mismatch(facts, hidden=parsed.feature_size, vocab=parsed.vocab_size)
    aux = parsed.aux_layer_ids or default_aux_layers(facts.layers)
    if not wrong and (len(set(aux)) != len(aux) or not all(1 <= i < facts.layers for i in aux)):
        wrong = f"its tapped layers {tuple(aux)} do not fit the target's {facts.layers}"
    verifier = model_name(parsed.base_model) if parsed.base_model else ""
    if not wrong and verifier and verifier != facts.name and verifier not in facts.name:
        wrong = f"made for '{parsed.base_model}'"
    if not wrong:
        wrong = _too_weak(parsed.mlxspec.get("acceptance"))
    named = bool(verifier) or _named_for(facts, repo, r"^eagle-?3-?|-eagle-?3.*$")
    return Candidate("eagle3", repo, path, size, not wrong, wrong or _sizes_match(named), named and not wrong)


# Our heads record their held-out depth-1 acceptance. The Gemma 3 270M head recorded 0.39, accepted 13-16% live
# and ran at 0.90-0.95x plain (docs/benchmarks.md): --draft auto takes a head from this acceptance up.
MIN_HEAD_ACCEPTANCE = 0.5


def _too_weak(acceptance: Any) -> str:
    """Why a head of ours is too weak for --draft auto to pick ("" when it is not, or records nothing)."""
    if not isinstance(acceptance, list) or not acceptance or not isinstance(acceptance[0], (int, float)):
        return ""
    if acceptance[0] >= MIN_HEAD_ACCEPTANCE:
        return ""
    floor = MIN_HEAD_ACCEPTANCE
    return f"its held-out acceptance {acceptance[0]:.2f} is below {floor}, too low to pay (--eagle runs it)"


def _vocabulary_key(path: Path) -> tuple | None:
    """The tokenizer's content: its vocabulary and its added tokens (id, text, special), or None if unreadable."""
    raw = _json(path / "tokenizer.json")
    model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    vocab, tokens = model.get("vocab"), raw.get("added_tokens", [])
    try:  # someone else's file: a vocab or added_tokens of the wrong shape is unreadable, not a crash
        items = tuple(sorted(vocab.items())) if isinstance(vocab, dict) else tuple(map(tuple, vocab))
        added = tuple(sorted((t.get("id"), t.get("content"), bool(t.get("special"))) for t in tokens))
        hash((items, added))
    except (TypeError, AttributeError, ValueError):
        return None
    return items, added


def _judge_draft_model(repo: str, path: Path, facts: TargetFacts, size: int) -> Candidate | None:
    if path.resolve() == facts.path.resolve():
        return None
    mine, theirs = facts.vocabulary, _vocabulary_key(path)
    if mine is None or theirs is None:
        return Candidate("draft", repo, path, size, False, "no readable tokenizer.json to compare")
    if theirs[0] != mine[0]:
        return Candidate("draft", repo, path, size, False, "another tokenizer (vocabulary differs)")
    if theirs[1] != mine[1]:
        return Candidate("draft", repo, path, size, False, "the same vocabulary but other special tokens")
    if facts.size_bytes and size * 2 > facts.size_bytes:
        return Candidate("draft", repo, path, size, False, "the target's tokenizer, but not under half its size")
    return Candidate("draft", repo, path, size, True, "the target's tokenizer (vocabulary and special tokens)")


def _mtp_candidates(facts: TargetFacts, snapshots: list[tuple[str, Path]]) -> list[Candidate]:
    """The target's native MTP head: in its own files, or in a cached checkpoint of the same model that keeps it."""
    from mlxspec.drafting.heads.mtp_weights import LAYOUTS, holds_mtp_tensors

    layout = LAYOUTS.get(facts.family)
    if layout is None:
        return []
    prefix = layout.prefix.format(n=facts.layers)
    found = []
    places = [(str(facts.path), facts.path)] + [(r, p) for r, p in snapshots if p.resolve() != facts.path.resolve()]
    for repo, path in places:
        config = _json(path / "config.json")
        try:
            own = text_config(config) if config else {}
            same = (own.get("model_type"), own.get("num_hidden_layers"), own.get("hidden_size")) == (
                facts.family,
                facts.layers,
                facts.hidden,
            )
            holds = same and holds_mtp_tensors(path, prefix)
        except ENTRY_ERRORS:  # judged (and named) with the other candidates
            continue
        if holds:
            where = "in the target's own files" if path == facts.path else "in a cached original checkpoint"
            found.append(Candidate("mtp", repo, path, 0, True, f"the target's native MTP head, {where}", True))
    return found


def find_drafters(
    target_path: Path, target_name: str = "", cache: Path | None = None, also: list[tuple[str, Path]] = ()
) -> list[Candidate]:
    """Every cached drafter (the Hugging Face cache's, mlxspec's own trained heads, and those in `also`: (name,
    directory)) judged against the target, best first (matches before mismatches)."""
    facts = TargetFacts.of(target_path, target_name)
    broken: list[tuple[str, Path, str]] = []
    snapshots = list(also) + local_heads() + cached_snapshots(cache, broken)
    found = _mtp_candidates(facts, snapshots)
    found += [Candidate("unreadable", repo, path, 0, False, why) for repo, path, why in broken]
    for repo, path in snapshots:
        try:
            candidate = judge(repo, path, facts)
        except ENTRY_ERRORS as error:  # one damaged entry is named and passed over; the others are read
            candidate = Candidate("unreadable", repo, path, 0, False, _unreadable(error))
        if candidate is not None:
            found.append(candidate)
    return sorted(found, key=lambda c: (not c.matches, KIND_ORDER.index(c.kind), not c.named_for_target, c.size_bytes))


def pick(candidates: list[Candidate]) -> Candidate | None:
    """The drafter --draft auto uses: the best match, or None (prompt lookup)."""
    return next((c for c in candidates if c.matches), None)


def choice_line(chosen: Candidate | None, considered: int) -> str:
    if chosen is None:
        return f"--draft auto: no cached drafter fits this target ({considered} considered); prompt lookup drafts"
    where = "shipped with mlxspec" if chosen.source == "embedded" else "from the cache"
    return f"--draft auto: {chosen.flag} {chosen.source} {where} ({chosen.why})"


def describe(candidates: list[Candidate]) -> list[dict[str, Any]]:
    return [c.to_dict() for c in candidates]


@dataclass
class AutoChoice:
    """What --draft auto picked (None: prompt lookup), among which candidates, and what failed to load."""

    chosen: Candidate | None
    candidates: list[Candidate]
    skipped: list[str]
    drafters: Any  # api.Drafters of the chosen one, loaded

    @property
    def line(self) -> str:
        line = choice_line(self.chosen, len(self.candidates))
        return line + (f" (passed over: {'; '.join(self.skipped)})" if self.skipped else "")

    def to_dict(self) -> dict:
        return {
            "line": self.line,
            "chosen": self.chosen.to_dict() if self.chosen is not None else None,
            "considered": len(self.candidates),
            "passed_over": self.skipped,
        }
