"""`mlxspec bench acceptance`: tau (tokens per target call) and alpha by depth of every drafter on held-out prompts.

alpha_d is the share of steps that keep depth d among those that drafted depth d with depth d-1 kept. No timings
here (those are `mlxspec bench`): the counts depend only on the seeds, so two runs give the same table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlxspec.bench.steps import Steps, machine

MAX_DEPTH = 64


@dataclass
class AcceptanceConfig:
    model: str | None = None
    draft: str | None = None  # None: the embedded draft with the embedded target
    eagle: str | None = None
    medusa: str | None = None
    dflash: str | None = None
    draft_model: bool = True  # False: no draft-model row, even the embedded one
    lookup: bool = True
    depth: int = 6
    num_prompts: int = 8
    max_tokens: int = 128
    temperatures: tuple[float, ...] = (0.0, 0.7)
    eagle_trees: list[tuple[int, int]] = field(default_factory=lambda: [(8, 2), (16, 4)])  # nodes, beam
    medusa_trees: list[tuple[int, int]] = field(default_factory=lambda: [(8, 2), (16, 4)])  # nodes, top-k
    ddtrees: list[tuple[int, int]] = field(default_factory=lambda: [(8, 2), (15, 3)])  # nodes, top-k


def parse_trees(flag: str, text: str) -> list[tuple[int, int]]:
    """'8:2,16:4' -> [(8, 2), (16, 4)] (nodes:top-k), refusing anything else in one line."""
    from mlxspec.errors import UserError

    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        nodes, _, topk = part.partition(":")
        if not (nodes.isascii() and nodes.isdigit() and topk.isascii() and topk.isdigit()):
            raise UserError(f"{flag} '{part}' is not NODES:TOPK (e.g. 8:2,16:4)")
        if not (2 <= int(topk) <= int(nodes) <= 256):
            raise UserError(f"{flag} '{part}': need 2 <= TOPK <= NODES <= 256")
        out.append((int(nodes), int(topk)))
    return out


def measure(target, options, prompts: list[list[int]], max_tokens: int, **drafter_args: Any) -> dict:
    """tau and alpha by depth of one drafter setting over the prompts (seed i for prompt i)."""
    from mlxspec.decoding.assembly import build_engine
    from mlxspec.drafting.factory import make_drafter
    from mlxspec.kernels import verify as verify_kernel

    kept_at = [0] * (MAX_DEPTH + 1)  # steps that kept at least d drafts
    drafted_at = [0] * (MAX_DEPTH + 1)  # steps that drafted depth d with depth d-1 kept
    calls = tokens = 0
    backend, _ = verify_kernel.resolve(options.kernel)
    view = verify_kernel.routed_view(target.model, backend)
    for seed, prompt in enumerate(prompts):
        drafter = make_drafter(options, target_model=target.model, **drafter_args)
        engine = build_engine(view, drafter, options, seed=seed)
        engine.prefill(prompt)
        produced = 0
        while produced < max_tokens:
            step = engine.step(max_tokens - produced)
            produced += len(step.tokens)
            depth = min(options.depth, step.drafted)  # a chain's drafts, or a tree's depth
            for d in range(1, depth + 1):
                drafted_at[d] += step.accepted >= d - 1
                kept_at[d] += step.accepted >= d
        calls += engine.target_calls
        tokens += produced
    alpha = [kept_at[d] / drafted_at[d] if drafted_at[d] else 0.0 for d in range(1, options.depth + 1)]
    return {"tau": round(tokens / calls, 3), "alpha_by_depth": [round(a, 3) for a in alpha], "target_calls": calls}


def runs_for(config: AcceptanceConfig, temperature: float, drafters: dict) -> dict:
    """name -> (DecodeOptions, drafter arguments) for every drafter present, chains and trees."""
    from mlxspec.options import DecodeOptions

    chain = DecodeOptions(temperature=temperature, num_draft=config.depth, lookup=False)
    runs: dict = {}
    if drafters.get("draft_model") is not None:
        runs["draft model chain"] = (chain, {"draft_model": drafters["draft_model"]})
    if config.lookup:
        runs["prompt lookup"] = (chain.updated(use_draft=False, lookup=True), {})
    if (dflash := drafters.get("dflash")) is not None:
        block = min(config.depth, dflash.config.block_size - 1)
        runs["dflash chain"] = (chain.updated(num_draft=block), {"dflash": dflash})
        for nodes, topk in config.ddtrees:
            tree = chain.updated(num_draft=block, tree_topk=topk, tree_nodes=nodes)
            runs[f"dflash ddtree {nodes}n top{topk}"] = (tree, {"dflash": dflash})
    if (head := drafters.get("feature_head")) is not None:
        runs["eagle chain"] = (chain, {"feature_head": head})
        for nodes, beam in config.eagle_trees:
            runs[f"eagle tree {nodes}n beam {beam}"] = (
                chain.updated(tree_topk=beam, tree_nodes=nodes),
                {"feature_head": head},
            )
    if (medusa := drafters.get("medusa")) is not None:
        heads = chain.updated(num_draft=medusa.config.num_heads)
        runs["medusa chain"] = (heads, {"medusa": medusa})
        for nodes, topk in config.medusa_trees:
            runs[f"medusa tree {nodes}n top{topk}"] = (
                heads.updated(tree_topk=topk, tree_nodes=nodes),
                {"medusa": medusa},
            )
    return runs


def load_drafters(config: AcceptanceConfig, target) -> dict:
    from mlxspec.loading import DEFAULT_DRAFT, load_model

    drafters: dict = {}
    draft = config.draft or (str(DEFAULT_DRAFT) if config.model is None else None)
    if draft and config.draft_model:
        drafters["draft_model"] = load_model(draft).model
    if config.eagle:
        from mlxspec.drafting.eagle3.files import load_eagle_head

        drafters["feature_head"] = load_eagle_head(config.eagle, target)  # an EAGLE-1/2 or an EAGLE-3 head
    if config.medusa:
        from mlxspec.drafting.heads.medusa import load_medusa

        drafters["medusa"] = load_medusa(config.medusa, target.path)
    if config.dflash:
        from mlxspec.drafting.dflash.files import load_dflash

        drafters["dflash"] = load_dflash(config.dflash, target)
    return drafters


def run_acceptance(config: AcceptanceConfig, echo=print) -> dict:
    """The rows of every drafter at every temperature; printed through `echo` as they finish."""
    import mlx.core as mx

    from mlxspec.bench.runner import heldout_prompts
    from mlxspec.loading import DEFAULT_TARGET, load_model

    target = load_model(config.model or DEFAULT_TARGET)
    drafters = load_drafters(config, target)
    prompts = heldout_prompts(target.tokenizer, config.num_prompts, 128)
    plan = {t: runs_for(config, t, drafters) for t in config.temperatures}
    steps = Steps(sum(len(runs) for runs in plan.values()), "bench acceptance")
    rows = {}
    for temperature, runs in plan.items():
        for name, (options, drafter_args) in runs.items():
            result = measure(target, options.validate(), prompts, config.max_tokens, **drafter_args)
            rows[f"{name} T={temperature}"] = result
            echo(f"{name:28s} T={temperature}: tau {result['tau']:.2f}  alpha by depth {result['alpha_by_depth']}")
            steps.done(f"{name} T={temperature}")
            mx.clear_cache()
    return {"machine": machine(), "prompts": len(prompts), "max_tokens": config.max_tokens, "rows": rows}
