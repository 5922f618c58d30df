"""History-dependent logits processors: repetition, presence and frequency penalties and a logit bias.

mlx-lm's own processors (`make_logits_processors`), applied as its `generate_step` applies them: to each token's
logits with every token before it. A verified row sees the committed history plus the drafted tokens on its path
(a chain's earlier drafts, a tree node's ancestors), so speculation keeps the processed law, and a seed its text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from mlxspec.decoding.draft import Draft

Processor = Callable[[mx.array, mx.array], mx.array]  # (tokens [L], logits [1, V]) -> logits [1, V]


def make_processors(options: Any) -> list[Processor]:
    """The processors DecodeOptions ask for (none by default)."""
    from mlx_lm.sample_utils import make_logits_processors

    return make_logits_processors(
        logit_bias=options.logit_bias or None,
        repetition_penalty=options.repetition_penalty,
        repetition_context_size=options.repetition_context_size,
        presence_penalty=options.presence_penalty,
        presence_context_size=options.presence_context_size,
        frequency_penalty=options.frequency_penalty,
        frequency_context_size=options.frequency_context_size,
    )


def processor_window(options: Any) -> int:
    """How many of the latest tokens the processors read (they slice tokens[-size:])."""
    return max(options.repetition_context_size, options.presence_context_size, options.frequency_context_size)


def process_rows(
    processors: list[Processor], logits: mx.array, history: Sequence[int], draft: Draft | None, window: int
) -> mx.array:
    """logits [N, V] of the rows after the pending token (row 0) and after each drafted node -> processed, row i
    with the last `window` committed tokens followed by the drafted tokens on its path."""
    base = mx.array(list(history[-window:]), dtype=mx.int32)
    rows = []
    for node in range(logits.shape[0]):
        tokens = base
        if node:
            path = draft.tree.path_to(node)
            tokens = mx.concatenate([base, draft.tokens[mx.array([n - 1 for n in path], dtype=mx.int32)]])
        row = logits[node : node + 1]
        for processor in processors:
            row = processor(tokens, row)
        rows.append(row)
    return mx.concatenate(rows)


def token_logprobs(
    logits: mx.array, rows: list[int], tokens: list[int], top: int
) -> list[tuple[float, list[tuple[int, float]]]]:
    """Each emitted token's log-probability under its row's processed logits, as mlx-lm's generate_step reports
    them (after the processors, before temperature and filters), and the `top` most likely ids with theirs. Read
    on the host: a second sync in a step that asks for them."""
    picked = logits[mx.array(rows, dtype=mx.int32)]
    logprobs = picked - mx.logsumexp(picked, axis=-1, keepdims=True)
    own = mx.take_along_axis(logprobs, mx.array(tokens, dtype=mx.int32)[:, None], axis=-1)[:, 0]
    if top == 0:
        return [(value, []) for value in own.tolist()]
    ids = mx.argsort(-logprobs, axis=-1)[:, :top]
    values = mx.take_along_axis(logprobs, ids, axis=-1)
    return [(value, list(zip(i, v))) for value, i, v in zip(own.tolist(), ids.tolist(), values.tolist())]
