"""`mlxspec tune`: measure, on this machine, every drafter a target has (draft model, EAGLE/EAGLE-3, MTP, DFlash,
Medusa, prompt lookup, and none) at several lengths, chains and trees, on a short calibration set, greedy and
sampled apart; keep the fastest only where it beats plain decoding by TUNE_MARGIN; and store the choice where
`generate`, `serve` and `chat` find it (keyed by machine, model files, MLX version and kernel).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlxspec.bench.runner import OWN_PLAIN, ModeResult, mlxspec_mode, run_modes
from mlxspec.platform import cache_dir
from mlxspec.results import mode_name

TUNE_MARGIN = 0.03  # plain decoding wins unless a drafter beats it by this much
DROP_BELOW = 0.90  # a tuned choice later measured below this share of plain's speed is dropped
MIN_TAU = 1.05  # a drafting setting that kept fewer tokens per target call than this did not draft: never stored
DRAFTERS = ("plain", "lookup", "draft", "eagle", "eagle3", "mtp", "dflash", "medusa")
REGIMES = {"greedy": 0.0, "sampled": 0.7}
CALIBRATION = (
    "import os\nimport sys\n\n\ndef main(argv):\n    ",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    'def parse_config(path):\n    """Read a key=value file into a dict."""\n    result = {}\n'
    "    with open(path) as f:\n",
    "The history of the printing press begins in the fifteenth century, when",
    "To make a good cup of tea, first bring fresh water to the boil. Then",
)


@dataclass
class Setting:
    """One way to decode: a drafter (by the flag that names it, and its source) and its length or tree."""

    drafter: str  # plain, lookup, draft, eagle, eagle3, mtp, dflash, medusa
    source: str | None = None
    num_draft: int | str = "auto"
    tree_topk: int = 1
    tree_nodes: int = 0

    @property
    def name(self) -> str:
        if self.drafter == "plain":
            return OWN_PLAIN
        depth = self.num_draft if isinstance(self.num_draft, int) else 0
        return (
            f"mlxspec {mode_name(self.drafter, depth=depth, tree_topk=self.tree_topk, tree_nodes=self.tree_nodes)}"
            + (f" k={self.num_draft}" if self.tree_topk == 1 else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def decode_options(self) -> dict[str, Any]:
        """The DecodeOptions fields this setting sets on a Speculator that holds its drafter."""
        if self.drafter == "plain":
            return {"use_draft": False, "lookup": False}
        if self.drafter == "lookup":
            return {"use_draft": False, "lookup": True, "num_draft": self.num_draft}
        return {"num_draft": self.num_draft, "tree_topk": self.tree_topk, "tree_nodes": self.tree_nodes or None}


def settings_for(drafter: str, source: str | None, max_depth: int = 0) -> list[Setting]:
    """The lengths and trees worth measuring for one drafter (max_depth: a block drafter's or Medusa's limit)."""
    if drafter == "plain":
        return [Setting("plain")]
    if drafter == "lookup":
        return [Setting("lookup", None, "auto")]
    if drafter == "medusa":
        return [Setting("medusa", source, max_depth), Setting("medusa", source, max_depth, tree_topk=2)]
    lengths = (3, 5, 7) if drafter == "dflash" else (2, 3, 4, 6)
    chains = [Setting(drafter, source, k) for k in lengths if not max_depth or k <= max_depth]
    chains.append(Setting(drafter, source, "auto"))
    if drafter == "draft":  # a static tree: depth x children
        return [*chains, Setting(drafter, source, 4, 2)]
    trees = {"eagle": [(8, 2), (16, 4)], "eagle3": [(8, 2), (16, 4)], "dflash": [(8, 2), (15, 3)]}
    depth = max_depth or 4
    for nodes, topk in trees.get(drafter, []):  # dynamic trees and DDTrees: a node budget
        chains.append(Setting(drafter, source, min(depth, max(2, nodes // topk)), topk, nodes))
    return chains


@dataclass
class Regime:
    """The outcome of one regime: the choice, plain's speed, the choice's, and every row measured."""

    choice: Setting
    plain_tokens_per_second: float
    choice_tokens_per_second: float
    rows: list[dict] = field(default_factory=list)
    dropped: str = ""  # why a later run dropped the choice ("" while it holds)
    reason: str = ""  # why this choice: the fastest that drafted, or why plain decoding won

    def to_dict(self) -> dict:
        return {**asdict(self), "choice": asdict(self.choice)}

    @classmethod
    def from_dict(cls, raw: dict) -> Regime:
        return cls(**{**raw, "choice": Setting(**raw["choice"])})


def choose(results: list[ModeResult], settings: dict[str, Setting]) -> Regime:
    """The fastest setting that drafted (tau >= MIN_TAU: a setting that barely drafted ran plain, and its speed is
    plain's noise), if it beats plain decoding by TUNE_MARGIN; else plain, saying why."""
    by_name = {r.mode: r for r in results}
    plain = by_name[OWN_PLAIN].tokens_per_second
    rows = [
        {"mode": r.mode, "tokens_per_second": r.tokens_per_second, "tau": r.tokens_per_target_call} for r in results
    ]
    drafting = [r for r in results if r.mode != OWN_PLAIN and r.tokens_per_target_call >= MIN_TAU]
    if not drafting:
        reason = f"no setting drafted (every tau below {MIN_TAU})"
        return Regime(Setting("plain"), plain, plain, rows, reason=reason)
    best = max(drafting, key=lambda r: r.tokens_per_second)
    if best.tokens_per_second < plain * (1 + TUNE_MARGIN):
        reason = (
            f"the fastest setting that drafted, {best.mode} at {best.tokens_per_second:.1f} tok/s (tau "
            f"{best.tokens_per_target_call:.2f}), does not beat plain's {plain:.1f} by {TUNE_MARGIN:.0%}"
        )
        return Regime(Setting("plain"), plain, plain, rows, reason=reason)
    reason = f"the fastest setting that drafted (tau {best.tokens_per_target_call:.2f})"
    return Regime(settings[best.mode], plain, best.tokens_per_second, rows, reason=reason)


def measure(
    speculators: dict[str | None, Any],
    settings: list[Setting],
    prompts: list[list[int]],
    max_tokens: int,
    temperature: float,
    top_p: float,
    progress,
) -> Regime:
    """Time every setting (plain first) in one interleaved pass over the prompts, then choose."""
    by_name = {s.name: s for s in settings}
    modes = {s.name: mlxspec_mode(speculators[s.source], **s.decode_options()) for s in settings}
    results = run_modes(modes, prompts, max_tokens, temperature, top_p, repeats=1, progress=progress)
    return choose(results, by_name)


# ---- where the choice is kept ----


def machine_identity() -> str:
    """What makes timings comparable: the CPU (model and count) and the OS and architecture."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or ""  # (macOS; it spawns `uname` on Linux, where /proc answers)
    return f"{platform.system()}-{platform.machine()}-{cpu}-{os.cpu_count()}"


def file_identity(path: Path) -> str:
    """A fingerprint of a model or drafter directory from its small files (configs) and its weights' sizes."""
    digest = hashlib.sha256()
    for file in sorted(path.glob("*")) if path.is_dir() else []:
        try:
            if file.suffix == ".json" and file.is_file():
                digest.update(file.name.encode() + file.read_bytes())
            elif file.suffix in (".safetensors", ".bin", ".npz"):
                digest.update(f"{file.name}:{file.stat().st_size}".encode())
        except OSError:  # unreadable or dangling: named by the loader, not here
            digest.update(f"{file.name}:unreadable".encode())
    return digest.hexdigest()[:16]


def tune_key(target_path: Path, mlx_version: str, kernel: str) -> dict[str, str]:
    return {
        "machine": machine_identity(),
        "model": file_identity(target_path),
        "model_path": str(target_path),
        "mlx": mlx_version,
        "kernel": kernel,
    }


def tune_file(key: dict[str, str]) -> Path:
    name = hashlib.sha256(json.dumps({k: v for k, v in key.items() if k != "model_path"}).encode()).hexdigest()[:20]
    return cache_dir() / "tune" / f"{name}.json"


def save_tune(key: dict[str, str], regimes: dict[str, Regime], drafters: dict[str, str]) -> Path:
    """Write the choices; `drafters` maps each chosen source to its file_identity, checked again at use."""
    path = tune_file(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "key": key,
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "drafters": drafters,
        "regimes": {name: regime.to_dict() for name, regime in regimes.items()},
    }
    write_atomically(path, record)
    return path


def write_atomically(path: Path, record: dict) -> None:
    """A temporary file of this writer's own in the same folder, renamed over `path`: two tune runs finishing
    together each write a whole record, and the last one stands."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(record, out, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class BadTuneRecord(Exception):
    """A stored tune record that cannot be used (hand-edited, damaged, or from another version): it is ignored."""


def any_tune_stored() -> bool:
    """Whether `mlxspec tune` ever stored anything here: otherwise a run need not fingerprint its model."""
    directory = cache_dir() / "tune"
    return directory.is_dir() and any(directory.glob("*.json"))


def load_tune(key: dict[str, str]) -> dict | None:
    """The stored record for this key; None when there is none. A record that is there but cannot be used raises
    BadTuneRecord, whose message names the file and how to get past it."""
    path = tune_file(key)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as error:
        raise BadTuneRecord(f"ignoring the tune record '{path}' ({type(error).__name__}); {RETUNE}") from None
    why = record_problem(record)
    if why:
        raise BadTuneRecord(f"ignoring the tune record '{path}' ({why}); {RETUNE}")
    return record


RETUNE = "run `mlxspec tune` again, delete the file, or pass --no-tune"


def record_problem(record: Any) -> str:
    """What makes a tune record unusable ("" when it is sound): every field read later is checked here."""
    if not isinstance(record, dict) or not isinstance(record.get("regimes"), dict):
        return "not a record with regimes"
    drafters = record.get("drafters", {})
    if not isinstance(drafters, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in drafters.items()
    ):
        return "drafters is not a map of paths to fingerprints"
    for name, raw in record["regimes"].items():
        if name not in REGIMES:
            return f"unknown regime {name!r}"
        try:
            regime = Regime.from_dict(raw)
        except (TypeError, KeyError):
            return f"the {name} regime is malformed"
        why = regime_problem(regime)
        if why:
            return f"the {name} regime: {why}"
    return ""


def regime_problem(regime: Regime) -> str:
    choice = regime.choice
    if choice.drafter not in DRAFTERS:
        return f"unknown drafter {choice.drafter!r}"
    if choice.source is not None and not isinstance(choice.source, str):
        return f"source {choice.source!r} is not a path"
    if not (choice.num_draft == "auto" or (type(choice.num_draft) is int and 1 <= choice.num_draft <= 64)):
        return f"num_draft {choice.num_draft!r} is not 1-64 or auto"
    if type(choice.tree_topk) is not int or not 1 <= choice.tree_topk <= 64:
        return f"tree_topk {choice.tree_topk!r} is not 1-64"
    if type(choice.tree_nodes) is not int or not 0 <= choice.tree_nodes <= 4096:
        return f"tree_nodes {choice.tree_nodes!r} is not 0-4096"
    for speed in (regime.plain_tokens_per_second, regime.choice_tokens_per_second):
        if type(speed) not in (int, float) or not 0 < speed < float("inf"):
            return f"a speed of {speed!r} is not a number of tokens per second"
    if not isinstance(regime.dropped, str) or not isinstance(regime.rows, list):
        return "dropped or rows is malformed"
    return ""


def tuned_regime(record: dict, temperature: float) -> tuple[str, Regime | None, str]:
    """(regime name, its choice, "" or why it does not apply) for a run at `temperature`."""
    name = "greedy" if temperature == 0 else "sampled"
    raw = record["regimes"].get(name)
    if raw is None:
        return name, None, f"nothing tuned for {name} decoding"
    regime = Regime.from_dict(raw)
    if regime.dropped:
        return name, None, f"the tuned choice was dropped ({regime.dropped})"
    source = regime.choice.source
    if source and record.get("drafters", {}).get(source) != file_identity(Path(source)):
        return name, None, f"the tuned drafter '{source}' changed or is gone since `mlxspec tune`"
    return name, regime, ""


def drop_if_slower(key: dict[str, str], regime_name: str, tokens: int, tokens_per_second: float) -> str:
    """After a run with the tuned choice: drop it if it ran below DROP_BELOW of plain's measured speed over at least
    64 tokens. Returns the note to print ("" when it holds)."""
    try:
        record = load_tune(key)
    except BadTuneRecord:  # already said when the run started
        return ""
    if record is None or tokens < 64 or regime_name not in record["regimes"]:
        return ""
    regime = Regime.from_dict(record["regimes"][regime_name])
    if regime.choice.drafter == "plain" or tokens_per_second >= DROP_BELOW * regime.plain_tokens_per_second:
        return ""
    regime.dropped = (
        f"{tokens_per_second:.1f} tok/s on {tokens} tokens, below plain's {regime.plain_tokens_per_second:.1f}"
    )
    record["regimes"][regime_name] = regime.to_dict()
    write_atomically(tune_file(key), record)
    return f"the tuned {regime.choice.name} ran slower than plain decoding; dropped it ({regime.dropped})"
