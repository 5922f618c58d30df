"""A draft model with another tokenizer than the target's (Timor et al., "Accelerating LLM Inference with Lossless
Speculative Decoding Algorithms for Heterogeneous Vocabularies", 2025).

The draft reads and writes text in its own tokens; the target verifies its own tokens, so exactness rests on the
target's verification alone, as with every drafter:

- greedy (SLEM, string-level exact match): the draft writes a few tokens greedily, their text is re-tokenized into
  target tokens continuing the target's own (vocab_bridge.retokenize), and the target verifies that chain as it
  verifies prompt lookup's, token by token. The text has to reach the host to be re-tokenized: one more sync a
  step than same-tokenizer drafting.
- sampled (TLI, token-level intersection): the draft samples only among the tokens both vocabularies hold, from
  its processed distribution renormalized over them, and hands the target that distribution in target ids; the
  target accepts by Leviathan/Chen rejection sampling, which is exact for any proposal law. Tokens outside the
  intersection are never drafted, yet still come out with the target's probabilities: rejection sampling draws
  the correction from the residual max(0, p - q), where all their mass lies.

The draft keeps its own tokens (`draft_ids`) for the text committed so far. After each step the accepted text is
matched against the draft's proposal: the draft tokens it covers whole stay in its cache, the rest is trimmed, and
the accepted text past them (a token straddling the boundary, the target's own next token) is re-encoded in the
draft's tokens and fed with the next proposal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from mlxspec.cache.recurrent import recurrent_leaves
from mlxspec.cache.rollback import make_speculative_cache, rollback
from mlxspec.decoding.draft import Draft, Drafter
from mlxspec.decoding.keys import draw
from mlxspec.decoding.sampling import SamplingConfig, to_probs
from mlxspec.drafting.cross_tokenizer.bridge import VocabBridge, complete_utf8
from mlxspec.drafting.draft_model.compiled import UNTRACEABLE, CompiledDraftChain, supports_compiled_draft
from mlxspec.errors import UserError
from mlxspec.kernels.many_rows import prompt_rows

PREFILL_CHUNK = 512


class CrossTokenizerDrafter(Drafter):
    def __init__(self, model: nn.Module, bridge: VocabBridge, sampling: SamplingConfig, max_draft: int):
        self.model, self.bridge, self.sampling = model, bridge, sampling
        # A proposal is re-tokenized: it may take up to twice as many draft tokens as target tokens asked for.
        self.max_rollback = 2 * max_draft + 3
        self.cache = make_speculative_cache(model, max_rollback=self.max_rollback)
        if recurrent_leaves(self.cache):
            raise UserError(
                "a draft with another tokenizer must be a transformer without recurrent layers (its cache is "
                "trimmed back to the accepted text); use a draft that shares the target's tokenizer"
            )
        self.history: Sequence[int] = []  # the engine's committed target tokens (read, never copied)
        self.committed = bytearray()  # their text
        self.synced = 0  # bytes of it the draft's tokens cover (a character still split across tokens waits)
        self.draft_ids: list[int] = []  # the draft's tokens for committed[:synced]; the last one not yet fed
        self.fed = 0  # draft tokens in the draft's cache
        self.proposal = mx.array([], dtype=mx.int32)  # this step's draft tokens: all but the last were fed
        self.calls = 0
        # Greedy chains run compiled where the draft's family allows it (as DraftModelDrafter's do); TLI's
        # restricted sampling runs eagerly.
        self.compiled: CompiledDraftChain | None = None

    def prefill(self, history: Sequence[int]) -> None:
        """Start over on `history` (a drafter kept by the prompt cache comes back here: it keeps nothing)."""
        self.cache, self.fed = make_speculative_cache(self.model, max_rollback=self.max_rollback), 0
        if self.sampling.greedy and supports_compiled_draft(self.model):
            self.compiled = CompiledDraftChain(self.model, self.sampling)
        self.history = history
        self.committed = bytearray(self.bridge.target_text(list(history)))
        text = complete_utf8(bytes(self.committed))
        self.draft_ids = self.bridge.encode_draft(text, first=True) or sorted(self.bridge.draft_eos)[:1] or [0]
        self.synced = len(text)
        with prompt_rows():  # the draft's prompt rows as GEMMs, as a draft model's (its bits only shape guesses)
            self._feed(self.draft_ids[:-1])

    def _feed(self, ids: list[int]) -> None:
        if self.compiled is not None:
            try:
                self.compiled.prefill(ids, PREFILL_CHUNK)
                self.fed = self.compiled.offset
                return
            except UNTRACEABLE:
                self._go_eager()
                return
        for start in range(0, len(ids), PREFILL_CHUNK):
            self.model(mx.array(ids[start : start + PREFILL_CHUNK], dtype=mx.int32)[None], cache=self.cache)
            mx.eval([c.state for c in self.cache])
        self.fed += len(ids)

    def _go_eager(self) -> None:
        """A family the compiled chain cannot trace: draft eagerly, rebuilding the cache from the draft's tokens."""
        self.compiled = None
        self.cache, self.fed = make_speculative_cache(self.model, max_rollback=self.max_rollback), 0
        self._feed(self.draft_ids[:-1])

    def _draft_length(self, num_tokens: int) -> int:
        """Draft tokens to write for num_tokens target tokens (+1: the last is dropped as unstable), by how many
        bytes a token of each tokenizer has carried so far."""
        if not self.history or not self.draft_ids or not self.synced:
            return num_tokens + 1
        ratio = (len(self.committed) / len(self.history)) / (self.synced / len(self.draft_ids))
        return max(1, min(2 * num_tokens + 2, math.ceil((num_tokens + 1) * ratio)))

    def propose(self, num_tokens: int, key: mx.array | None) -> Draft | None:
        if self.synced < len(self.committed):
            return None  # a character split across target tokens: its draft tokens wait for its rest
        greedy = self.sampling.greedy
        if not greedy and self.bridge.shared == 0:
            return None  # no token both vocabularies hold: nothing to draft by intersection
        count = self._draft_length(num_tokens) if greedy else num_tokens
        if self.compiled is not None:
            try:
                self.proposal, _ = self.compiled.propose(self.draft_ids[self.fed :], count, None)
                self.fed, self.calls = self.compiled.offset, self.calls + count
                return self._slem(self.proposal.tolist(), num_tokens)
            except UNTRACEABLE:
                self._go_eager()
        keys = None if greedy else key  # [count, 2]: each draft token's output position's key
        inputs = mx.array(self.draft_ids[self.fed :], dtype=mx.int32)
        tokens, target_probs = [], []
        for i in range(count):
            logits = self.model(inputs[None], cache=self.cache)[0, -1]
            self.fed += inputs.shape[0]
            if greedy:
                token = mx.argmax(logits).astype(mx.int32)
            else:
                token, q = self._sample_shared(logits, keys[i])
                target_probs.append(q)
            tokens.append(token)
            mx.async_eval(token)
            inputs = token[None]
        self.calls += count
        self.proposal = mx.stack(tokens)
        if not greedy:
            return Draft(self.bridge.to_target_mx[self.proposal], mx.stack(target_probs))
        return self._slem(self.proposal.tolist(), num_tokens)

    def _sample_shared(self, logits: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
        """TLI: one draft token drawn from the draft's processed distribution over the shared tokens only, and that
        distribution in target ids [target_width] (uniform over the shared tokens where it has no mass there)."""
        q = mx.where(self.bridge.shared_mask, to_probs(logits, self.sampling), 0.0)
        total = q.sum()
        uniform = self.bridge.shared_mask.astype(q.dtype) / self.bridge.shared
        q = mx.where(total > 0, q / mx.maximum(total, 1e-30), uniform)
        on_target = mx.zeros(self.bridge.target_width, dtype=q.dtype)
        on_target = on_target.at[self.bridge.shared_target_ids].add(q[self.bridge.shared_draft_ids])
        # Drawn in target ids with the target's key for this position, as the target draws (a [1, V] row): the
        # coupled draw (decoding/keys.py); the draft model goes on with that token's draft id
        target_token = draw(mx.log(on_target)[None], key[None])[0]
        return self.bridge.to_draft_mx[target_token], on_target

    def _slem(self, proposal: list[int], num_tokens: int) -> Draft | None:
        ended = next((i for i, t in enumerate(proposal) if t in self.bridge.draft_eos), None)
        text = self.bridge.draft_text(proposal[:ended])
        target = self.bridge.retokenize(list(self.history[-4:]), text, ended is not None)[:num_tokens]
        return Draft(mx.array(target, dtype=mx.int32)) if target else None

    def accept(self, emitted: list[int], drafted: list[int]) -> None:
        """Keep the draft tokens the accepted text covers whole; re-encode the rest of it in draft tokens."""
        self.committed += self.bridge.target_text(emitted)
        new_text = complete_utf8(bytes(self.committed[self.synced :]))
        proposal = self.proposal.tolist() if self.proposal.size else []
        covered, at = 0, 0
        for token in proposal:
            piece = self.bridge.draft_bytes[token] if 0 <= token < self.bridge.draft_width else None
            if not piece or not new_text.startswith(piece, at):
                break
            covered, at = covered + 1, at + len(piece)
        before = len(self.draft_ids)
        self.draft_ids += proposal[:covered] + (self.bridge.encode_draft(new_text[at:]) if new_text[at:] else [])
        self.synced += len(new_text)
        keep = min(before + covered, len(self.draft_ids) - 1)  # the last draft token stays unfed: drafting's start
        if self.fed > keep:
            if self.compiled is not None:
                self.compiled.trim(self.fed - keep)
            else:
                rollback(self.cache, self.fed - keep)
            self.fed = keep
        self.proposal = mx.array([], dtype=mx.int32)
