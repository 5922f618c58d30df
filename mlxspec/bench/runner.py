"""`mlxspec bench`: every decoding mode over the same prompts in one process, against mlx-lm's own paths."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.sample_utils import make_sampler

from mlxspec.drafting.lookup.corpus import read_text, split_files
from mlxspec.loading import LoadedModel
from mlxspec.results import mode_name

OWN_PLAIN = "mlxspec plain"  # mlxspec's own plain decoding: the 'vs own' column divides by it
NOISY = 0.10  # a baseline whose passes differ by more than this is flagged: the machine's speed drifted


@dataclass
class Run:
    tokens: int
    seconds: float
    target_calls: int
    drafted: int = 0
    accepted: int = 0
    peak_memory_bytes: int = 0
    mode: str = ""  # mlxspec's own name of what ran (results.mode_name), as -v and --json print it
    num_draft: int | str = 0


@dataclass
class ModeResult:
    mode: str
    tokens_per_second: float  # median over repeats of (all tokens / all seconds)
    tokens_per_second_min: float
    tokens_per_second_max: float
    acceptance_rate: float
    tokens_per_target_call: float
    target_calls_per_token: float
    peak_memory_bytes: int
    speedup: float = 0.0  # against the first mode, mlx-lm's plain decoding
    speedup_vs_own_plain: float = 0.0  # against mlxspec's own plain decoding (speculation's share of the gain)
    runs: list[dict] = field(default_factory=list)


RunFn = Callable[[list[int], int, float, float, int], Run]
# A mlxspec.speculator.Speculator, built by the command line: bench sits below the API and imports none of it.
Speculator = Any


def widened_target(target: LoadedModel, spec) -> LoadedModel:
    """The target widened in memory (widen.py); its name keys its own cost curve."""
    from mlxspec.bench.widen import widen

    model, config = widen(target.model, target.config, spec)
    return LoadedModel(
        model, target.tokenizer, config, target.path.parent / f"{target.path.name}-widened-{spec.layers}x{spec.width}"
    )


def parameter_count(target: LoadedModel) -> str:
    from mlx.utils import tree_flatten

    return f"{sum(v.size for _, v in tree_flatten(target.model.parameters())) / 1e6:.1f}M parameters"


def heldout_prompts(tokenizer, num_prompts: int = 8, prompt_tokens: int = 128) -> list[list[int]]:
    """Token-level prefixes of held-out stdlib files: they end on a real token boundary, as in training."""
    _, heldout = split_files()
    prompts = []
    for path in heldout:
        text = read_text(path)
        if not text:
            continue
        ids = tokenizer.encode(text)
        if len(ids) >= prompt_tokens + 64:
            prompts.append(ids[:prompt_tokens])
        if len(prompts) == num_prompts:
            break
    return prompts


def mlx_lm_plain(model) -> RunFn:
    def run(prompt, max_tokens, temperature, top_p, seed):
        mx.random.seed(seed)
        sampler = make_sampler(temperature, top_p if top_p < 1 else 0.0)
        mx.reset_peak_memory()
        start = time.perf_counter()
        count = 0
        for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens, sampler=sampler):
            count += 1
        return Run(count, time.perf_counter() - start, count, peak_memory_bytes=mx.get_peak_memory())

    return run


def mlx_lm_speculative(model, draft_model, num_draft: int) -> RunFn:
    def run(prompt, max_tokens, temperature, top_p, seed):
        mx.random.seed(seed)
        sampler = make_sampler(temperature, top_p if top_p < 1 else 0.0)
        mx.reset_peak_memory()
        start = time.perf_counter()
        count = accepted = target_calls = drafted = 0
        step_starts = True
        for _, _, from_draft in speculative_generate_step(
            mx.array(prompt), model, draft_model, sampler=sampler, num_draft_tokens=num_draft, max_tokens=max_tokens
        ):
            if step_starts:  # each step drafts min(num_draft, tokens left), then calls the target once
                drafted += min(num_draft, max_tokens - count)
                target_calls += 1
            count += 1
            accepted += bool(from_draft)
            step_starts = not from_draft
        seconds = time.perf_counter() - start
        return Run(count, seconds, target_calls, drafted, accepted, mx.get_peak_memory())

    return run


@dataclass
class MlxspecMode:
    """One mlxspec row: the speculator and the generate options it runs with."""

    speculator: Speculator
    options: dict

    def __call__(self, prompt, max_tokens, temperature, top_p, seed) -> Run:
        result = self.speculator.generate(
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop_at_eos=False,
            **self.options,
        )
        s = result.stats
        return Run(
            s.generated_tokens,
            s.prompt_seconds + s.generation_seconds,
            s.target_calls,
            s.drafted,
            s.accepted,
            s.peak_memory_bytes,
            s.mode,
            s.num_draft,
        )


def mlxspec_mode(speculator: Speculator, **options) -> RunFn:
    return MlxspecMode(speculator, options)


def with_residual_twins(modes: dict[str, RunFn]) -> dict[str, RunFn]:
    """`modes` with, after each mlxspec chain drafted by a model or heads (the drafts that sample), the same row
    under acceptance="residual" (Leviathan/Chen), named '... acceptance=residual'."""
    out: dict[str, RunFn] = {}
    for name, run in modes.items():
        out[name] = run
        sampled = isinstance(run, MlxspecMode) and run.options.get("use_draft", True) and "-tree" not in name
        if sampled and name != OWN_PLAIN and not name.startswith(f"{OWN_PLAIN} "):
            out[f"{name} acceptance=residual"] = MlxspecMode(run.speculator, {**run.options, "acceptance": "residual"})
    return out


def run_modes(
    modes: dict[str, RunFn],
    prompts: list[list[int]],
    max_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    repeats: int = 3,
    seed: int = 0,
    progress: Callable[[str], None] = lambda s: None,
) -> list[ModeResult]:
    """Warm every mode up, then time `repeats` passes; each pass runs every mode over all prompts in turn.

    Interleaving matters on a shared machine, whose speed drifts by 10-20% over minutes: drift then hits every
    mode alike. The first mode is the baseline; speedup is the median over passes of the within-pass ratio.
    """
    for fn in modes.values():  # warm-up, each mode a whole run: compile kernels, allocate caches at every length
        fn(prompts[0], max_tokens, temperature, top_p, seed)  # (8 tokens left a first plain pass 40% slow)
    passes: dict[str, list[list[Run]]] = {name: [] for name in modes}
    clock = PassClock(list(modes), repeats)
    for r in range(repeats):
        for name, fn in modes.items():
            started = time.perf_counter()
            runs = [fn(p, max_tokens, temperature, top_p, seed + 1000 * r + i) for i, p in enumerate(prompts)]
            passes[name].append(runs)
            rate = sum(x.tokens for x in runs) / sum(x.seconds for x in runs)
            eta = clock.done(name, time.perf_counter() - started)
            progress(f"pass {r + 1}/{repeats} {name}: {rate:.1f} tok/s, about {eta:.0f} s left at this temperature")
    rates = {
        name: [sum(x.tokens for x in runs) / sum(x.seconds for x in runs) for runs in mode_passes]
        for name, mode_passes in passes.items()
    }
    base_rates = next(iter(rates.values()))
    own_rates = rates.get(OWN_PLAIN)
    results = []
    for name, mode_passes in passes.items():
        every = [x for runs in mode_passes for x in runs]
        tokens, calls = sum(x.tokens for x in every), sum(x.target_calls for x in every)
        drafted, accepted = sum(x.drafted for x in every), sum(x.accepted for x in every)
        results.append(
            ModeResult(
                mode=name,
                tokens_per_second=statistics.median(rates[name]),
                tokens_per_second_min=min(rates[name]),
                tokens_per_second_max=max(rates[name]),
                acceptance_rate=accepted / drafted if drafted else 0.0,
                tokens_per_target_call=tokens / calls if calls else 0.0,
                target_calls_per_token=calls / tokens if tokens else 0.0,
                peak_memory_bytes=max(x.peak_memory_bytes for x in every),
                speedup=statistics.median(rate / base for rate, base in zip(rates[name], base_rates)),
                speedup_vs_own_plain=statistics.median(r / o for r, o in zip(rates[name], own_rates))
                if own_rates
                else 0.0,
                runs=[asdict(x) for x in every],
            )
        )
    return results


class PassClock:
    """Seconds left in a benchmark: each mode's time in the last pass it ran, the mean of those timed for the rest."""

    def __init__(self, modes: list[str], repeats: int):
        self.modes, self.repeats = modes, repeats
        self.seconds: dict[str, float] = {}
        self.finished = 0

    def done(self, mode: str, seconds: float) -> float:
        self.seconds[mode] = seconds
        self.finished += 1
        mean = sum(self.seconds.values()) / len(self.seconds)
        left_in_pass = self.modes[self.finished % len(self.modes) :] if self.finished % len(self.modes) else []
        full_passes = self.repeats - -(-self.finished // len(self.modes))  # passes not started yet
        per_pass = sum(self.seconds.get(m, mean) for m in self.modes)
        return sum(self.seconds.get(m, mean) for m in left_in_pass) + full_passes * per_pass


def noise_note(results: list[ModeResult], repeats: int) -> str:
    """One line when the timings cannot show small differences: one pass, or a baseline that drifted between passes."""
    if not results:
        return ""
    if repeats == 1:
        return "note: one pass measures no noise; this machine's speed can drift 10-40%, so use --repeats 3 or more"
    base = results[0]
    spread = (base.tokens_per_second_max - base.tokens_per_second_min) / base.tokens_per_second
    if spread > NOISY:
        return (
            f"note: {base.mode} varied by {100 * spread:.0f}% between passes; the machine was noisy, so trust the "
            f"within-pass speedups over tok/s, and differences under {100 * spread:.0f}% not at all"
        )
    return ""


def format_table(results: list[ModeResult]) -> str:
    """One row per mode (the column fits the longest name; the range only where passes differed), then the fastest."""
    width = max([28, *(len(r.mode) for r in results)])
    header = (
        f"{'mode':{width}s} {'tok/s':>8s} {'(min-max)':>15s} {'speedup':>8s} {'vs own':>7s} {'alpha':>6s} {'tau':>5s} "
        f"{'calls/tok':>9s} {'peak MiB':>8s}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        varied = r.tokens_per_second_min != r.tokens_per_second_max  # one pass (--repeats 1) has no range
        spread = f"({r.tokens_per_second_min:.1f}-{r.tokens_per_second_max:.1f})" if varied else ""
        own = f"{r.speedup_vs_own_plain:6.2f}x" if r.speedup_vs_own_plain else f"{'-':>7s}"  # no own-plain row
        lines.append(
            f"{r.mode:{width}s} {r.tokens_per_second:8.1f} {spread:>15s} "
            f"{r.speedup:7.2f}x {own} "
            f"{r.acceptance_rate:6.2f} {r.tokens_per_target_call:5.2f} "
            f"{r.target_calls_per_token:9.2f} {r.peak_memory_bytes / 2**20:8.1f}"
        )
    if results:
        best = max(results, key=lambda r: r.tokens_per_second)
        lines.append(
            f"fastest: {best.mode}, {best.tokens_per_second:.1f} tok/s ({best.speedup:.2f}x {results[0].mode})"
        )
    return "\n".join(lines)


def build_modes(
    speculator: Speculator,
    ks: tuple[int, ...],
    families: set[str],
    medusa: Speculator | None = None,
    tree_topk: int = 2,
    tree_depth: int = 4,
    eagle: Speculator | None = None,
    lookup_ks: tuple[int, ...] = (4, 8),
    dflash: Speculator | None = None,
) -> dict[str, RunFn]:
    """Every mode worth comparing, first the baseline (mlx-lm's plain decoding with the same target). `medusa` and
    `eagle`: the same target with Medusa heads or a feature head (EAGLE or MTP) as its drafter.

    Rows are named `mlxspec MODE k=K`, MODE as results.mode_name names it in -v and --json; a setting that differs
    from the defaults follows as key=value."""
    target = speculator.target.model
    draft = speculator.draft.model if speculator.draft is not None else None
    modes: dict[str, RunFn] = {"mlx-lm plain": mlx_lm_plain(target)}
    if draft is not None and "mlx-lm" in families:
        for k in ks:
            modes[f"mlx-lm speculative k={k}"] = mlx_lm_speculative(target, draft, k)
    if "plain" in families:
        modes[OWN_PLAIN] = mlxspec_mode(speculator, use_draft=False)
        if speculator.options.kernel != "off":
            modes[f"{OWN_PLAIN} kernel=off"] = mlxspec_mode(speculator, use_draft=False, kernel="off")
    if draft is not None and "draft" in families:
        for k in ks:
            modes[f"mlxspec draft k={k}"] = mlxspec_mode(speculator, num_draft=k)
    if draft is not None and "adaptive" in families:
        modes["mlxspec draft k=auto"] = mlxspec_mode(speculator, num_draft="auto")
    if draft is not None and "tree" in families:
        name = mode_name("draft", depth=tree_depth, tree_topk=tree_topk)
        modes[f"mlxspec {name}"] = mlxspec_mode(speculator, num_draft=tree_depth, tree_topk=tree_topk)
    if "lookup" in families:
        longest = max(lookup_ks)
        for k in lookup_ks:
            modes[f"mlxspec lookup k={k}"] = mlxspec_mode(speculator, use_draft=False, lookup=True, num_draft=k)
        if draft is None:  # what generate runs by default for a model with no drafter of its own
            modes["mlxspec lookup k=auto"] = mlxspec_mode(speculator, use_draft=False, lookup=True, num_draft="auto")
        modes[f"mlxspec lookup k={longest} corpus=off"] = mlxspec_mode(
            speculator, use_draft=False, lookup=True, num_draft=longest, corpus_fallback=False
        )
        modes[f"mlxspec {mode_name('lookup', lookup_candidates=3)} k={longest}"] = mlxspec_mode(
            speculator, use_draft=False, lookup=True, num_draft=longest, lookup_candidates=3
        )
        if draft is not None:
            modes[f"mlxspec lookup+draft k={min(lookup_ks)}"] = mlxspec_mode(
                speculator, lookup=True, num_draft=min(lookup_ks)
            )
    if medusa is not None and "medusa" in families:
        heads = medusa.medusa.config.num_heads
        modes[f"mlxspec medusa k={heads}"] = mlxspec_mode(medusa, num_draft=heads)
        name = mode_name("medusa", depth=heads, tree_topk=2)
        modes[f"mlxspec {name}"] = mlxspec_mode(medusa, num_draft=heads, tree_topk=2)
        name = mode_name("medusa", depth=heads, tree_topk=4)  # 16 nodes over 4 heads: the best tree measured
        modes[f"mlxspec {name}"] = mlxspec_mode(medusa, num_draft=heads, tree_topk=4, tree_nodes=4 * heads)
    if eagle is not None and "eagle" in families:  # an EAGLE head or a native MTP head
        kind = eagle.feature_head.config.kind if eagle.feature_head.config.kind in ("eagle", "eagle3") else "mtp"
        for k in ks:
            modes[f"mlxspec {kind} k={k}"] = mlxspec_mode(eagle, num_draft=k)
        modes[f"mlxspec {kind} k=auto"] = mlxspec_mode(eagle, num_draft="auto")  # what generate runs by default
        if "lookup" in families:  # lookup where the text repeats, the head elsewhere
            modes[f"mlxspec lookup+{kind} k=auto"] = mlxspec_mode(eagle, lookup=True, num_draft="auto")
        for nodes, beam in EAGLE_TREES:
            name = mode_name(kind, tree_topk=beam, tree_nodes=nodes)
            modes[f"mlxspec {name}"] = mlxspec_mode(eagle, num_draft=nodes // beam, tree_topk=beam, tree_nodes=nodes)
    if dflash is not None and "dflash" in families:
        block = dflash.dflash.config.block_size - 1
        for k in sorted({min(k, block) for k in ks}):
            modes[f"mlxspec dflash k={k}"] = mlxspec_mode(dflash, num_draft=k)
        modes["mlxspec dflash k=auto"] = mlxspec_mode(dflash, num_draft="auto")  # what generate runs by default
        for nodes, topk in DDTREES:
            name = mode_name("dflash", tree_topk=topk, tree_nodes=nodes)
            modes[f"mlxspec {name}"] = mlxspec_mode(dflash, num_draft=block, tree_topk=topk, tree_nodes=nodes)
    return modes


EAGLE_TREES = ((8, 2), (16, 4))  # (node budget, beam) of the EAGLE-2 dynamic trees bench compares
DDTREES = ((8, 2), (15, 3), (31, 4))  # (node budget, candidates per position) of DFlash's DDTrees
