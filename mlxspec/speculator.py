"""The Speculator: a loaded target and drafter, generating (`generate`, `stream`) with per-call DecodeOptions."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import mlx.core as mx

from mlxspec.cache.rollback import CacheSpec, rollback_room
from mlxspec.chat_template import encode_messages
from mlxspec.decoding.assembly import build_engine
from mlxspec.decoding.draft import Drafter
from mlxspec.decoding.forward import drive_alone
from mlxspec.decoding.prompt_cache import PromptCache, Reuse
from mlxspec.drafting.cross_tokenizer.bridge import cross_tokenizer_bridge
from mlxspec.drafting.describe import describe_drafter
from mlxspec.drafting.lookup.suffix_index import DEFAULT_SUFFIX_BUDGET, SuffixIndex
from mlxspec.drafting.provider import DrafterProvider
from mlxspec.errors import UserError
from mlxspec.kernels import verify as verify_kernel
from mlxspec.loading import LoadedModel
from mlxspec.options import DecodeOptions
from mlxspec.results import Chunk, GenerationResult, Stats
from mlxspec.text import TextStream, encodable


class Speculator:
    """A loaded target (and optional draft model or Medusa heads) ready for repeated generation.

    `options` are the defaults of every call; `generate(prompt, temperature=0.7)` overrides one of them.
    """

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None = None,
        medusa=None,
        options: DecodeOptions | None = None,
        feature_head=None,
        prompt_cache: int = 0,
        sharding=None,
        dflash=None,
        drafter_choice: dict | None = None,
        suffix_cache_tokens: int = DEFAULT_SUFFIX_BUDGET,
    ):
        # A draft with another tokenizer drafts across vocabularies (cross_tokenizer.py); `cross_tokenizer` says so.
        self.vocab_bridge, self.cross_tokenizer = cross_tokenizer_bridge(target, draft) if draft else (None, "")
        given = [
            name
            for name, x in (
                ("a draft model", draft),
                ("Medusa heads", medusa),
                ("a feature head", feature_head),
                ("a DFlash drafter", dflash),
            )
            if x is not None
        ]
        if len(given) > 1:
            raise UserError(f"{given[0]} and {given[1]} are two drafters; pass one of them")
        if not isinstance(prompt_cache, int) or prompt_cache < 0:
            raise UserError(f"prompt_cache {prompt_cache!r} must be a whole number of conversations to keep (0: off)")
        self.target = target
        self.draft = draft
        self.truncate_hint = "truncate=True"  # how a too-long prompt's refusal names the fix (the CLI: --truncate)
        self.medusa = medusa  # MedusaHeads or None
        self.feature_head = feature_head  # feature_head.FeatureHead (EAGLE or MTP) or None
        self.dflash = dflash  # dflash_model.DFlashDraftModel or None
        self.options = (options or DecodeOptions()).validate()
        # Each run's drafter and draft-length controller (drafting/provider.py).
        self.drafting = DrafterProvider(target, draft, medusa, feature_head, dflash, self.vocab_bridge)
        self.last_stats = Stats()
        self._routed_counts: dict[tuple[int, int], int] = {}
        # prompt_cache N > 0: the last N runs keep their caches, and a next prompt prefills only past its longest
        # common prefix with one of them (a chat or server resending conversations). A running stream holds its
        # caches alone: another stream started meanwhile takes another entry or starts cold.
        self.prompt_cache = PromptCache(prompt_cache) if prompt_cache else None
        self.sharding = sharding  # distributed.Sharding: the target split across ranks, or None
        self.drafter_choice = drafter_choice  # what --draft auto picked from the cache and why (discovery.py)
        # The suffix cache (suffix_index.py): made by the first run that asks for it (options.suffix), then fed every
        # run's output, within a budget of suffix_cache_tokens.
        self.suffix_cache_tokens = suffix_cache_tokens
        self.suffix_index: SuffixIndex | None = None
        self.compute_dtype = target.compute_dtype  # named by -v and --json (a seed's text depends on it)
        self.weights_note = target.weights_note  # a GGUF's block types as held, said again by -v and --json

    @property
    def reports(self) -> bool:
        """Whether this process prints and reports: always, but on sharded ranks rank 0 alone."""
        return self.sharding is None or self.sharding.rank == 0

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def vocab_size(self) -> int:
        """Rows of the target's output: every id a prompt may hold."""
        return self.target.vocab_size

    def encode(self, prompt: str | list[int], chat: bool = False) -> list[int]:
        if isinstance(prompt, (list, tuple)):
            tokens = list(prompt)
            bad = next(
                (t for t in tokens if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size),
                None,
            )
            if bad is not None:
                raise UserError(f"prompt token {bad!r} is not a token id of this model (0..{self.vocab_size - 1})")
        elif isinstance(prompt, str):
            if not prompt:
                raise UserError("the prompt is empty; pass some text to continue")
            prompt = encodable(prompt)  # lone surrogates cannot be tokenized: U+FFFD instead
            if chat:
                tokens = encode_messages(self.tokenizer, [{"role": "user", "content": prompt}], self.target.path)
            else:
                tokens = self.tokenizer.encode(prompt)
        else:
            raise UserError(f"the prompt is a {type(prompt).__name__}; pass a string or a list of token ids")
        if not tokens:
            raise UserError("the prompt encodes to no tokens; pass some text to continue")
        return tokens

    def fit_context(self, tokens: list[int], options: DecodeOptions, stats: Stats) -> list[int]:
        """The prompt, or with options.truncate its last tokens that leave room for max_tokens in the context."""
        context = self.target.context_length
        if context is None or len(tokens) <= context:
            return tokens
        if not options.truncate:
            raise UserError(
                f"the prompt has {len(tokens)} tokens but the model's context is {context}; "
                f"pass {self.truncate_hint} to keep its last tokens, or shorten it"
            )
        keep = max(1, context - min(options.max_tokens, context // 2))
        stats.prompt_truncated_from = len(tokens)
        return tokens[-keep:]

    def stream(self, prompt: str | list[int], options: DecodeOptions | None = None, **changes: Any) -> Iterator[Chunk]:
        """Yield text as the target accepts it. Stats of the run land in `self.last_stats` as it goes.

        `options` (default: this Speculator's) with `changes` applied, e.g. stream(p, temperature=0.7, lookup=True);
        see DecodeOptions for every field.
        """
        stats = self.last_stats = Stats()
        yield from drive_alone(self.events(prompt, self.call_options(options, changes), stats))

    def call_options(self, options: DecodeOptions | None, changes: dict) -> DecodeOptions:
        """This call's options: `options` (default: this Speculator's) with `changes`, validated."""
        if options is not None and not isinstance(options, DecodeOptions):
            raise UserError(
                f"options {options!r} is a {type(options).__name__}; pass a DecodeOptions, or its fields as keywords"
            )
        chosen = (options or self.options).updated(**changes)
        lookup_is_the_drafter = self.options.lookup and not self.drafting.has_model_drafter
        if options is not None and lookup_is_the_drafter and chosen.use_draft and "lookup" not in changes:
            # load() chose prompt lookup as this model's drafter: a call's use_draft=True drafts with it, as the
            # default options do (use_draft=False decodes plainly)
            chosen = chosen.updated(lookup=True)
        if chosen.xtc_probability and chosen.xtc_special_tokens is None:  # mlx-lm's generate: "\n" and the end
            ends = list(getattr(self.tokenizer, "eos_token_ids", None) or [])
            chosen = chosen.updated(xtc_special_tokens=list(self.tokenizer.encode("\n")) + ends)
        return chosen.validate(self.vocab_size)

    def events(
        self, prompt: str | list[int], options: DecodeOptions, stats: Stats, rows: Any = None, may_draft: Any = None
    ):
        """One run as a generator of Chunks and of the target forwards it needs (forward.ForwardRequest), each
        answered by whoever drives it: alone (stream) or batched with other runs' (batching.py). `stats` fills
        as it goes; `rows()` says how many rows decode together now (this one included), and `may_draft()` whether
        the batch lets rows draft this round (batching.DraftingGovernor)."""
        tokens = self.fit_context(self.encode(prompt, options.chat), options, stats)
        stats.prompt_tokens = len(tokens)
        healed_text, first_token_mask = "", None
        if options.heal:
            from mlxspec.healing import heal as heal_prompt

            tokens, healed_text, first_token_mask = heal_prompt(self.tokenizer, tokens)
        options = options.updated(acceptance=options.acceptance_rule())  # (before the seed is drawn: auto reads it)
        stats.acceptance = "" if options.sampling.greedy else options.acceptance
        stats.seed = options.seed if options.seed is not None else int.from_bytes(os.urandom(4), "little")
        if self.sharding is not None and options.seed is None:
            stats.seed = self.sharding.common_seed(stats.seed)
        backend, status = verify_kernel.resolve(options.kernel)
        if status.startswith("unavailable"):
            verify_kernel.warn_once_without_kernel(status)
        # The routed views are built once per model and kept; the models themselves are never changed.
        target = verify_kernel.routed_view(self.target.model, backend)
        head = verify_kernel.routed_view(self.feature_head, backend) if self.feature_head is not None else None
        stats.kernel = f"{backend.name} ({self._routed_layers(target, head)} layers)" if backend is not None else status
        stats.dtype = self.compute_dtype
        stats.weights = self.weights_note
        options, tree_note = self._chain_if_no_trees(options)
        suffix_index = self._suffix_index() if options.suffix else None
        # the draft model reads its weights at their own bits through the kernel too (MLX's CPU quantized_matmul
        # runs on one thread at a tenth of the bandwidth)
        draft = verify_kernel.routed_view(self.draft.model, backend) if self.draft is not None else None
        drafting = self.drafting.for_run(
            options, target, head, suffix_index, lookup_by_default=self.options.lookup, draft_model=draft
        )
        drafter, controller, stats.note = drafting.drafter, drafting.controller, drafting.note
        stats.note = stats.note or tree_note
        stats.mode = describe_drafter(drafter, options)
        depth = min(options.depth, drafter.max_depth or options.depth) if drafter is not None else 0
        stats.num_draft = 0 if drafter is None else ("auto" if controller is not None else depth)
        arithmetic = backend.name if backend is not None else "mlx"
        reuse = self._reuse(tokens, drafter, options, arithmetic)
        if self.prompt_cache is not None:
            stats.reused_tokens, stats.prompt_cache = reuse.target_tokens, reuse.how
        engine = build_engine(
            target,
            reuse.drafter,
            options,
            seed=stats.seed,
            context_length=self.target.context_length,
            controller=controller,
            cache=reuse.cache,
            ranks=self.sharding,
            first_token_mask=first_token_mask,
        )
        if rows is not None:
            engine.rows = rows
        if may_draft is not None:
            engine.may_draft = may_draft
        try:
            yield from self._run(engine, reuse, tokens, options, stats, healed_text)
        finally:  # finished, stopped by the caller, or failed: only a run that is between steps leaves a usable state
            if self.prompt_cache is not None:
                self.prompt_cache.keep(engine.kept_state(), options.drafting_key, arithmetic)
            if self.suffix_index is not None:  # the output (committed tokens), after the prompt's last few tokens
                self.suffix_index.add(engine.history[max(0, len(tokens) - self.suffix_index.max_ngram) :])

    def _suffix_index(self) -> SuffixIndex:
        if self.suffix_index is None:
            self.suffix_index = SuffixIndex(self.suffix_cache_tokens)
        return self.suffix_index

    def _routed_layers(self, target, head) -> int:
        """How many layers of the target (and feature head) call the verify kernel: counted once per view."""
        key = (id(target), id(head))
        if key not in self._routed_counts:
            self._routed_counts[key] = verify_kernel.count_routed(target) + (
                verify_kernel.count_routed(head) if head is not None else 0
            )
        return self._routed_counts[key]

    def _reuse(self, tokens: list[int], drafter: Drafter | None, options: DecodeOptions, arithmetic: str) -> Reuse:
        """The caches the last run left that this prompt can continue from, or a cold start (prompt_cache.py);
        `arithmetic`: the kernel that computes this run (a cache from another one is not reused)."""
        if self.prompt_cache is None:
            return Reuse(None, 0, drafter, 0, "")
        spec = CacheSpec(rollback_room(drafter, options.depth, options.max_nodes), options.kv_bits)
        return self.prompt_cache.take(tokens, spec, drafter, options.drafting_key, arithmetic)

    def _run(self, engine, reuse: Reuse, tokens, options: DecodeOptions, stats: Stats, healed_text: str):
        mx.reset_peak_memory()
        drafter = engine.drafter
        start = time.perf_counter()
        yield from engine.prefill_phases(tokens, reuse.target_tokens, reuse.drafter_tokens)
        stats.prompt_seconds = time.perf_counter() - start
        text = TextStream(self.tokenizer, options.stop, options.stop_at_eos, skip=len(healed_text))
        start = time.perf_counter()
        finish = None
        while finish is None:
            step = yield from engine.step_phases(options.max_tokens - stats.generated_tokens)
            stats.target_calls = engine.target_calls
            stats.batch_rows = engine.row_steps / engine.target_calls
            stats.sorted_fallbacks = engine.sorted_fallbacks
            stats.drafted += step.drafted
            stats.accepted += step.accepted
            stats.tree_nodes = max(stats.tree_nodes, step.drafted + 1 if options.tree_topk > 1 else 0)
            new_tokens, saw_eos = text.cut_at_eos(step.tokens)
            stats.generated_tokens += len(new_tokens)
            room = engine.room()  # positions left in the target's context after the pending token
            if saw_eos:
                finish = "stop"
            elif stats.generated_tokens >= options.max_tokens:
                finish = "length"
            elif room is not None and room < 0:
                finish = "length"
                full = f"the {self.target.context_length}-token context is full: stopped before max_tokens"
                stats.note = f"{stats.note}; {full}" if stats.note else full
            piece, stopped = text.add(new_tokens, final=finish is not None)
            finish = "stop" if stopped else finish
            paused = engine.controller.pause_note() if finish is not None and engine.controller is not None else ""
            if paused:
                stats.note = f"{stats.note}; {paused}" if stats.note else paused
            stats.generation_seconds = time.perf_counter() - start
            stats.draft_calls = drafter.calls if drafter is not None else 0
            stats.peak_memory_bytes = mx.get_peak_memory()
            yield Chunk(piece, new_tokens, finish, None if step.logprobs is None else step.logprobs[: len(new_tokens)])

    def _chain_if_no_trees(self, options: DecodeOptions) -> tuple[DecodeOptions, str]:
        """A tree on a target that cannot verify one drafts a chain as deep instead, with a note saying why."""
        wants_tree = options.tree_topk > 1 or (options.lookup and options.lookup_candidates > 1)
        if not wants_tree:
            return options, ""
        from mlxspec.decoding.tree_attention import tree_refusal

        why = tree_refusal(self.target.model)
        if self.vocab_bridge is not None and options.use_draft:
            why = why or "a draft with another tokenizer drafts chains (its text is re-tokenized step by step)"
        if self.sharding is not None and not self.sharding.everyone(why is None):
            why = why or "another rank cannot verify a tree on its part of the model"
        if why is None:
            return options, ""
        depth = options.num_draft if options.adaptive else options.depth
        chain = options.updated(tree_topk=1, tree_nodes=None, lookup_candidates=1, num_draft=depth)
        return chain, f"{why}; drafting a chain instead"

    def warm_up(self) -> None:
        """What a first run would measure (this device's cost curve, the draft chain's timings, greedy and sampled),
        measured now behind its progress line: a server warms up before its first request waits on it."""
        prompt = [t % self.vocab_size for t in range(1, 9)]
        suffix_index = self.suffix_index
        for temperature in (0.0, 0.7):
            options = self.options.updated(
                max_tokens=2, temperature=temperature, logprobs=None, stop=[], chat=False, heal=False
            )
            for _ in self.stream(prompt, options.updated(seed=0) if temperature else options):
                pass
        if self.prompt_cache is not None:
            self.prompt_cache.clear()
        self.suffix_index = suffix_index  # the warm-up's tokens are nobody's output

    def generate_batch(
        self, prompts: list, options: DecodeOptions | list[DecodeOptions] | None = None, max_batch: int | None = None
    ) -> list[GenerationResult]:
        """generate for every prompt, decoded together with one batched target forward a step (batching.py); each
        row exact on its own. `options`: one for all, or one per prompt. Results in order."""
        from mlxspec.batching import generate_batch

        return generate_batch(self, prompts, options, max_batch)

    def generate(
        self, prompt: str | list[int], options: DecodeOptions | None = None, **changes: Any
    ) -> GenerationResult:
        pieces, tokens, finish = [], [], None
        for chunk in self.stream(prompt, options, **changes):
            pieces.append(chunk.text)
            tokens.extend(chunk.tokens)
            finish = chunk.finish_reason
        return GenerationResult("".join(pieces), tokens, self.last_stats, finish)
