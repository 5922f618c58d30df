"""The verify paths: from the target's logits over a draft to what the step keeps, one host read each.

- A sampled chain (the draft carries its q): Leviathan/Chen rejection (acceptance.accept_sampled_chain).
- A deterministic chain or tree (greedy drafts, prompt lookup, top-k trees, Medusa): the target is sampled at
  every node and the drafts that match are followed (sample-and-match, acceptance.accept_node_samples).
- A plain step samples one token (`target_samples`; the engine interleaves it with the next queued forward).

Each path reads the host once through `host` (the engine's sync, which agrees across sharded ranks). In the rare case
where a target row's top-p set reached past its ranked candidates, the path draws again from the whole vocabulary
ranked, with the same key, and reads the host a second time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from mlxspec.decoding.acceptance import accept_node_samples, accept_sampled_chain
from mlxspec.decoding.draft import Draft
from mlxspec.decoding.keys import draw, draw_kept
from mlxspec.decoding.sampling import SamplingConfig, scaled_logprobs_kept, to_probs_checked, to_probs_sorted

Host = Callable[[mx.array], list[int]]  # evaluates and reads an array on the host: the step's sync
Mark = Callable[..., None]  # the engine's profiling mark: (phase, *arrays finished by then)


@dataclass
class Verdict:
    """What verification decided.

    accepted: drafts kept from the front of a chain, or the deepest node of a tree whose path matched;
    next_token: the target's own token after them; proposed: every drafted token, on the host;
    redrawn: the whole-vocabulary redraw ran (a top-p set past the ranked candidates).
    """

    accepted: int
    next_token: int
    proposed: list[int]
    redrawn: bool = False


def target_samples(
    logits: mx.array,
    sampling: SamplingConfig,
    keys: mx.array | None,
    ranked: bool = False,
    coin_keys: mx.array | None = None,
) -> tuple[mx.array, mx.array]:
    """([N] one draw per row from the processed target distribution, row i with keys[i] (its output position's
    key, decoding/keys.py), the argmax when greedy; [] bool: some row ranked too few candidates and must be redrawn
    with ranked=True, the whole vocabulary ranked, same keys)."""
    if sampling.greedy:
        return mx.argmax(logits, axis=-1).astype(mx.int32), mx.array(False)
    scaled, short, candidates = scaled_logprobs_kept(logits, sampling, ranked, coin_keys)
    tokens = draw(scaled, keys) if candidates is None else draw_kept(scaled, candidates, keys)
    return tokens, short.any()


def verify_sampled_chain(
    draft: Draft, logits: mx.array, sampling: SamplingConfig, key: mx.array, host: Host, mark: Mark
) -> Verdict:
    """A sampled chain by Leviathan/Chen rejection against the target's processed distribution at each position."""
    target_probs, short = to_probs_checked(logits, sampling)
    mark("target probs", target_probs)
    accepted = accept_sampled_chain(draft, target_probs, key, sampling.greedy)
    values = host(mx.concatenate([*accepted, short.any()[None].astype(mx.int32), draft.tokens]))
    redrawn = bool(values[2])
    if redrawn:
        ranked = to_probs_sorted(logits, sampling)
        values[:2] = host(mx.concatenate(accept_sampled_chain(draft, ranked, key, sampling.greedy)))
    return Verdict(values[0], values[1], values[3:], redrawn)


def verify_nodes(
    draft: Draft,
    pending: list[int],
    logits: mx.array,
    sampling: SamplingConfig,
    keys: mx.array | None,
    host: Host,
    mark: Mark,
    coin_keys: mx.array | None = None,
) -> Verdict:
    """A deterministic or coupled chain or tree, node by node: `accepted` is the deepest node whose path matched the
    target's own samples, row i drawn with keys[i] (and its XTC coin with coin_keys[i])."""
    samples, short = target_samples(logits, sampling, keys, coin_keys=coin_keys)
    mark("target probs", samples)
    matched = accept_node_samples(draft, pending, samples)
    values = host(mx.concatenate([*matched, short[None].astype(mx.int32), draft.tokens]))
    redrawn = bool(values[2])
    if redrawn:
        samples = target_samples(logits, sampling, keys, ranked=True, coin_keys=coin_keys)[0]
        values[:2] = host(mx.concatenate(accept_node_samples(draft, pending, samples)))
    return Verdict(values[0], values[1], values[3:], redrawn)
