"""Leviathan/Chen rejection sampling for a chain of drafted tokens, vectorized over positions.

Pure functions of arrays: no model, no cache, no host sync. Everything stays lazy until the engine's one sync.
"""

from __future__ import annotations

import mlx.core as mx

from mlxspec.decoding.draft import Draft
from mlxspec.decoding.sampling import sample
from mlxspec.decoding.trees import accept_tree_samples


def residual_distribution(target_probs: mx.array, draft_probs: mx.array) -> mx.array:
    """norm(max(0, p - q)) per row; rows where it is all zero (p == q) fall back to p.

    target_probs, draft_probs: [N, V]. Returns [N, V].
    """
    residual = mx.maximum(target_probs - draft_probs, 0.0)
    mass = residual.sum(axis=-1, keepdims=True)
    return mx.where(mass > 0, residual / mx.maximum(mass, 1e-30), target_probs)


def accept_chain(
    draft_tokens: mx.array,
    draft_probs: mx.array,
    target_probs: mx.array,
    key: mx.array,
    greedy: bool = False,
) -> tuple[mx.array, mx.array]:
    """Verify K drafted tokens against the target in one vectorized pass.

    draft_tokens: [K] int32, the drafted tokens x_1..x_K, each sampled from its row of draft_probs.
    draft_probs:  [K, V] processed draft distributions q_1..q_K.
    target_probs: [K+1, V] processed target distributions p_1..p_{K+1}; p_i scores x_i and p_{K+1} is the bonus.
    Returns (num_accepted [] int32 in 0..K, next_token [] int32): accept x_i with probability min(1, p_i(x_i)/q_i(x_i))
    while all before it were accepted; then sample the next token from norm(max(0, p - q)) at the first rejection,
    or from p_{K+1} when all K were accepted.
    """
    return _compiled_accept_chain(draft_tokens, draft_probs, target_probs, key, greedy)


def _accept_chain(draft_tokens, draft_probs, target_probs, key, greedy):
    num_draft = draft_tokens.shape[0]
    accept_key, sample_key = mx.random.split(key)
    index = draft_tokens[:, None]
    p_x = mx.take_along_axis(target_probs[:num_draft], index, axis=-1)[:, 0]
    q_x = mx.take_along_axis(draft_probs, index, axis=-1)[:, 0]
    u = mx.random.uniform(shape=(num_draft,), key=accept_key)
    accepted = u * q_x < p_x  # u < p/q without dividing; q_x > 0 because x was sampled from q
    num_accepted = mx.cumprod(accepted.astype(mx.int32)).sum().astype(mx.int32)
    # Only the row where drafting stopped is needed: the residual there, or the bonus row when all were accepted.
    p_row = mx.take(target_probs, num_accepted, axis=0)
    q_row = mx.take(draft_probs, mx.minimum(num_accepted, num_draft - 1), axis=0)
    chosen = mx.where(num_accepted == num_draft, p_row, residual_distribution(p_row[None], q_row[None])[0])
    return num_accepted, sample(chosen, sample_key, greedy)


# Compiled once per (K, V) shape: the acceptance math runs as a few fused kernels instead of ~20 separate ops.
_compiled_accept_chain = mx.compile(_accept_chain)


def accept_deterministic_chain(draft_tokens: mx.array, target_samples: mx.array) -> tuple[mx.array, mx.array]:
    """Verify a deterministic chain (greedy drafts, prompt lookup): accept x_i while it equals the target's draw.

    draft_tokens: [K] int32. target_samples: [K+1] int32, one draw from each of p_1..p_{K+1} (the argmax when
    greedy). Returns (num_accepted [] int32, next_token [] int32). This is accept_chain with one-hot q: accept x_i
    w.p. p_i(x_i), else draw from p_i with x_i removed; drawing y ~ p_i and keeping it when y != x_i is that law.
    """
    matches = (draft_tokens == target_samples[: draft_tokens.shape[0]]).astype(mx.int32)
    num_accepted = mx.cumprod(matches).sum().astype(mx.int32)
    return num_accepted, target_samples[num_accepted]


def pad_vocab(probs: mx.array, vocab_size: int) -> mx.array:
    """Zero-pad distributions to vocab_size, so a target and draft with differently padded embeddings compare."""
    missing = vocab_size - probs.shape[-1]
    if missing <= 0:
        return probs
    return mx.concatenate([probs, mx.zeros((*probs.shape[:-1], missing), probs.dtype)], axis=-1)


def accept_sampled_chain(draft: Draft, target_probs: mx.array, key: mx.array, greedy: bool) -> list[mx.array]:
    """[num_accepted [1], next_token [1]] for a sampled chain by Leviathan/Chen rejection sampling (accept_chain);
    the draft's and the target's distributions are padded to one vocabulary first."""
    vocab = max(target_probs.shape[-1], draft.probs.shape[-1])
    num_accepted, next_token = accept_chain(
        draft.tokens, pad_vocab(draft.probs, vocab), pad_vocab(target_probs, vocab), key, greedy
    )
    return [num_accepted[None], next_token[None]]


def accept_node_samples(draft: Draft, pending: list[int], samples: mx.array) -> list[mx.array]:
    """[deepest accepted node [1], next token [1]] for a deterministic chain or tree, from one target draw per node
    (`pending`: the token fed ahead of the draft, the tree's root)."""
    shape = draft.tree
    if shape.is_chain:
        deepest, next_token = accept_deterministic_chain(draft.tokens, samples)
    else:
        node_tokens = mx.concatenate([mx.array(pending, dtype=mx.int32), draft.tokens])
        parents = mx.array([0, *shape.parents[1:]], dtype=mx.int32)
        deepest, next_token = accept_tree_samples(node_tokens, parents, samples, shape.max_depth)
    return [deepest[None], next_token[None]]
