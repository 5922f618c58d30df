"""The target sharded over `mx.distributed` ranks (started by `mlx.launch`), the drafter replicated on every rank.

Every rank runs the same engine on the same tokens: the drafter (a draft model, prompt lookup or heads) is small and
deterministic, so identical inputs and seeds (rank 0's, `common_seed`) give identical drafts without communicating
them. Two guards keep the ranks together anyway: they must run the same software (`check_same_software`, once),
and every step's draft (its size, tree shape and tokens) is rank 0's (`same_draft`, before the target reads it), so
a drafter that rounds differently on another chip cannot feed the ranks different forwards. Only the target is
split, by mlx-lm's own code:
- tensor: every layer's heads and MLP units split (`model.shard(group)`), two all-reduces per layer;
- pipeline: consecutive layers per rank (`model.model.pipeline(group)`), one hop per rank and a final all-gather
  that gives every rank the last hidden state.
Either way one verify pass of K+1 tokens pays the same communication as a single token. The step's one host sync
carries rank 0's accepted count and tokens to every rank (`agree`), so ranks can never disagree on what was emitted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from mlxspec.cache.rollback import model_family, recurrent_family
from mlxspec.decoding.draft import Draft
from mlxspec.decoding.engine import to_host
from mlxspec.decoding.target_features import text_model
from mlxspec.decoding.trees import TreeShape
from mlxspec.errors import UserError
from mlxspec.plan.rank_split import MODES, RankSplit, check_split, num_layers

LAUNCH = "mlx.launch -n 2 --backend ring --python PYTHON LAUNCHER generate ... --distributed MODE"
JOIN_TIMEOUT = 300  # seconds a rank waits for the others to join (MLXSPEC_JOIN_TIMEOUT changes it)


@dataclass
class Sharding:
    mode: str
    group: mx.distributed.Group

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    def shard(self, model: nn.Module, config: dict) -> None:
        """Split the target across the ranks, in place (before its weights are read); refuse a split mlx-lm cannot
        make in one line, as `plan --ranks` does."""
        check_split(config, RankSplit(self.size, self.mode), model_family(model))
        if self.mode == "tensor":
            model.shard(self.group)
            return
        text_model(model).model.pipeline(self.group)
        # Recurrent layers change how a step rolls back (replaying tokens), so every rank must hold some or none.
        recurrent = mx.distributed.all_gather(mx.array([int(recurrent_family(model))]), group=self.group).tolist()
        if len(set(recurrent)) > 1:
            layers = num_layers(config)
            raise UserError(
                f"splitting {model_family(model)}'s {layers} layers over {self.size} ranks leaves recurrent "
                "layers on some ranks only; use fewer ranks or --distributed tensor"
            )

    def agree(self, values: mx.array) -> mx.array:
        """Rank 0's `values` on every rank: one all-reduce, lazy, so it rides in the host sync that reads them.

        Every rank's share is computed from `values` (zeros as values * 0), so the all-reduce runs after the forward's
        own on every rank: collectives must come in the same order everywhere."""
        return mx.distributed.all_sum(values * int(self.rank == 0), group=self.group)

    def same_draft(self, draft: Draft | None, capacity: int) -> Draft | None:
        """Rank 0's draft on every rank (its size, tree shape and tokens), before the target reads it.

        One all-reduce and one host sync of its own: a shape decided on the host (a lookup tree, an EAGLE-2 dynamic
        tree, or no draft at all) could otherwise differ between ranks, and the ranks would then run forwards of
        different sizes. The sync also finishes the all-reduce before a pipeline's stages send and receive."""
        agreed = to_host(self.agree(encode_draft(draft, capacity)))
        return decode_draft(agreed, draft, self.rank)

    def everyone(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank (a check each rank makes on its own part of the model)."""
        return int(mx.distributed.all_sum(mx.array([int(flag)]), group=self.group).item()) == self.size

    def common_seed(self, seed: int) -> int:
        """Rank 0's seed on every rank (a random one is drawn on each rank; seeds fit 32 bits)."""
        return int(self.agree(mx.array([seed], dtype=mx.int64)).item())

    def check_same_software(self) -> None:
        """Refuse in one line when ranks run different Python, MLX, mlx-lm or mlxspec: their drafters (the lookup
        corpus is the interpreter's standard library) and tree shapes could then differ."""
        mine = software_fingerprint()
        gathered = mx.distributed.all_gather(mx.array([zlib.crc32(mine.encode())], dtype=mx.int64), group=self.group)
        fingerprints = gathered.tolist()
        others = [r for r, value in enumerate(fingerprints) if value != fingerprints[0]]
        if others:
            raise UserError(
                f"rank {others[0]} runs other software than rank 0 (this rank: {mine}); install the same versions "
                "on every machine"
            )


def software_fingerprint() -> str:
    import platform

    import mlx_lm

    from mlxspec import __version__

    return (
        f"Python {platform.python_version()}, MLX {mx.__version__}, mlx-lm {mlx_lm.__version__}, mlxspec {__version__}"
    )


def encode_draft(draft: Draft | None, capacity: int) -> mx.array:
    """[3 + 2 * capacity] int32: node count, is-a-tree, has-probabilities, parents (-1 padded), tokens (0 padded).
    Lazy in the tokens, so a draft model's chain is computed inside the same evaluation."""
    if draft is None:
        return mx.array([0, 0, 0] + [-1] * capacity + [0] * capacity, dtype=mx.int32)
    count = draft.tokens.shape[0]
    assert count <= capacity, (count, capacity)
    parents = list(draft.shape.parents[1:]) if draft.shape is not None else list(range(count))
    header = [count, int(draft.shape is not None), int(draft.probs is not None)] + parents + [-1] * (capacity - count)
    padding = mx.zeros((capacity - count,), dtype=mx.int32)
    return mx.concatenate([mx.array(header, dtype=mx.int32), draft.tokens.astype(mx.int32), padding])


def decode_draft(values: list[int], local: Draft | None, rank: int) -> Draft | None:
    """The draft `values` (encode_draft's layout) describe. Probabilities are this rank's own (rank 0's on rank 0;
    elsewhere they only feed an acceptance that rank 0's outcome replaces), so they must at least fit."""
    count, is_tree, has_probs = values[:3]
    if count == 0:
        return None
    capacity = (len(values) - 3) // 2
    parents, tokens = values[3 : 3 + count], values[3 + capacity : 3 + capacity + count]
    probs = local.probs if local is not None else None
    if has_probs and (probs is None or probs.shape[0] != count):
        raise UserError(
            f"rank {rank} drafted other tokens than rank 0 (its drafter computes differently); run the same models "
            "and software on every machine"
        )
    shape = TreeShape((-1, *parents)) if is_tree else None
    return Draft(mx.array(tokens, dtype=mx.int32), probs if has_probs else None, shape)


def check_launch_environment() -> None:
    """The ring backend's settings from mlx.launch (MLX_HOSTFILE, MLX_RANK), refused in one line when they cannot
    work, before MLX reads them and raises from C++."""
    hostfile, rank = os.environ.get("MLX_HOSTFILE"), os.environ.get("MLX_RANK")
    if hostfile is None:
        return
    try:
        hosts = json.loads(Path(hostfile).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        reason = getattr(error, "strerror", None) or type(error).__name__
        raise UserError(
            f"MLX_HOSTFILE '{hostfile}' cannot be read as a hostfile ({reason}); let mlx.launch write it"
        ) from None
    if not isinstance(hosts, list) or not hosts:
        raise UserError(f"MLX_HOSTFILE '{hostfile}' holds no list of hosts; let mlx.launch write it")
    if rank is not None and (not (rank.isascii() and rank.isdigit()) or int(rank) >= len(hosts)):
        raise UserError(
            f"MLX_RANK {rank} is not one of the {len(hosts)} ranks in MLX_HOSTFILE '{hostfile}' (0..{len(hosts) - 1})"
        )


# Run beside a rank while it joins: mx.distributed.init() blocks in C++ holding the interpreter, so nothing inside
# the rank can time it out. After the timeout this says which ranks are not listening, then stops the rank.
WATCHDOG = """
import os, signal, socket, sys, time
pid, timeout, rank, hosts = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4:]
time.sleep(timeout)

def listening(address):
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except (OSError, ValueError):
        return False

missing = [f"{i} ({a})" for i, a in enumerate(hosts) if str(i) != rank and not listening(a)]
print(f"mlxspec: error: rank {rank} waited {timeout:g} s for the other ranks to join; not listening: "
      f"{', '.join(missing) or 'none (they may still be starting)'}; start every rank with mlx.launch, or raise "
      "MLXSPEC_JOIN_TIMEOUT", file=sys.stderr, flush=True)
os.kill(pid, signal.SIGTERM)
"""


def join_ranks(timeout: float) -> mx.distributed.Group:
    """mx.distributed.init(), stopped with one line naming the ranks that are not listening when the others have not
    joined within `timeout` seconds (a rank whose peer never starts would otherwise wait silently forever)."""
    hostfile = os.environ.get("MLX_HOSTFILE")
    if hostfile is None:  # not the ring backend's launch (or no launch at all): MLX answers at once
        return mx.distributed.init()
    hosts = [
        entry[0] if isinstance(entry, list) and entry else str(entry)
        for entry in json.loads(Path(hostfile).read_text())
    ]
    rank = os.environ.get("MLX_RANK", "?")
    command = [sys.executable, "-c", WATCHDOG, str(os.getpid()), str(timeout), rank, *hosts]
    watchdog = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        return mx.distributed.init()
    finally:
        watchdog.kill()
        watchdog.wait()


def start(mode: str) -> Sharding:
    """Join the ranks `mlx.launch` started, or refuse in one line where there are none."""
    if mode not in MODES:
        raise UserError(f"--distributed {mode} is not a mode; use {' or '.join(MODES)}")
    if not mx.distributed.is_available():
        raise UserError("this MLX build has no distributed backend; --distributed needs one (ring, MPI or JACCL)")
    check_launch_environment()
    group = join_ranks(float(os.environ.get("MLXSPEC_JOIN_TIMEOUT", JOIN_TIMEOUT)))
    if group.size() < 2:
        raise UserError(f"--distributed {mode} runs on several ranks; start them with `{LAUNCH}`")
    sharding = Sharding(mode, group)
    sharding.check_same_software()
    return sharding
