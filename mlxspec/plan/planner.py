"""`mlxspec plan`: do a target, its drafter and both KV caches fit a device at a context; what to change if not."""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from mlxspec.plan import memory_model as mm
from mlxspec.plan import rank_split as rs
from mlxspec.plan.devices import Device
from mlxspec.plan.metadata import ModelMetadata
from mlxspec.plan.rank_split import RankSplit
from mlxspec.plan.weights import compute_dtype, model_weight_bytes

RUNTIME_OVERHEAD = 400 * 2**20  # MLX, Python and the Metal library: not in mx.get_peak_memory, estimated


@dataclass(frozen=True)
class PlanRequest:
    target: ModelMetadata
    device: Device
    draft: ModelMetadata | None = None
    medusa_heads: int = 0
    context: int = 4096
    batch: int = 1
    target_bits: int | None = None  # None: as stored
    group_size: int = 64
    draft_bits: int | None = None
    kv_bits: int | None = None
    num_draft: int = 4
    tree_nodes: int | None = None
    draft_window: int | None = None
    split: RankSplit = RankSplit()  # the target sharded over ranks: plan the most loaded rank

    @property
    def verify_positions(self) -> int:
        return (self.tree_nodes or self.num_draft) + 1


@dataclass
class PlanItem:
    name: str
    bytes: int
    note: str = ""


@dataclass
class Plan:
    request: dict
    items: list[PlanItem]
    mlx_bytes: int  # what mx.get_peak_memory() should see: everything but the runtime overhead
    total_bytes: int
    budget_bytes: int
    fits: bool
    max_context: dict[str, int | None]
    drafter_overhead_bytes: int
    drafter_overhead_percent: float
    recommendations: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _state_note(config: dict, dtype: str) -> str:
    state = mm.recurrent_state_bytes(config, dtype)
    return f"; recurrent state {state / 2**20:.1f} MiB x 2 (one rollback snapshot)" if state else ""


# A sample of prose and code, tokenized by both tokenizers to compare how many tokens each needs for one text.
RATIO_SAMPLE = (
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts several tokens and verifies them at "
    "once; the output is exactly the target model's.\n\ndef fibonacci(n: int) -> int:\n    if n < 2:\n        "
    'return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\nprint({"answer": 42, "items": [1, 2, 3]})\n'
)


def draft_tokens_per_target_token(target: ModelMetadata, draft: ModelMetadata) -> float:
    """How many draft tokens hold the text of one target token: 1.0 for one tokenizer (or when either tokenizer
    is not on disk to compare), else measured on RATIO_SAMPLE."""
    if target.tokenizer_file is None or draft.tokenizer_file is None:
        return 1.0
    return _tokens_ratio(str(target.tokenizer_file), str(draft.tokenizer_file))


@functools.lru_cache(maxsize=8)
def _tokens_ratio(target_file: str, draft_file: str) -> float:
    """Read and tokenize once per pair: memory_items runs at every step of max_context's search."""
    if Path(target_file).read_bytes() == Path(draft_file).read_bytes():
        return 1.0
    try:
        from tokenizers import Tokenizer

        counts = [len(Tokenizer.from_file(f).encode(RATIO_SAMPLE).ids) for f in (target_file, draft_file)]
    except Exception:  # noqa: BLE001 - an unreadable tokenizer only loses the estimate
        return 1.0
    return counts[1] / counts[0] if counts[0] else 1.0


def memory_items(req: PlanRequest, context: int | None = None) -> list[PlanItem]:
    context = req.context if context is None else context
    rollback = req.verify_positions
    dtype = compute_dtype(req.device, req.target.config)
    items = []
    weight, note = model_weight_bytes(req.target, req.target_bits, req.group_size, req.device)
    share, layer_share = 1.0, 1.0
    if req.split.sharded:
        share = req.split.weight_share(req.target.config)
        layer_share = req.split.layer_share(rs.num_layers(req.target.config))
        note = f"{share:.0%} of {weight / 2**30:.2f} GiB ({note}): this rank's shard"
    items.append(PlanItem("target weights", int(weight * share), note))
    if req.draft is not None:
        weight, note = model_weight_bytes(req.draft, req.draft_bits, req.group_size, req.device)
        items.append(PlanItem("draft weights", weight, note))
    if req.medusa_heads:
        params = mm.medusa_parameters(req.target.config, req.medusa_heads)
        items.append(
            PlanItem("medusa heads", params * mm.DTYPE_BYTES[dtype], f"{req.medusa_heads} heads, shared LM head")
        )
    kv_note = f"{req.kv_bits}-bit" if req.kv_bits else dtype
    # A recurrent target keeps its state from before each verify pass (one snapshot) for rollback.
    target_kv = mm.kv_cache_bytes(
        req.target.config, context, rollback, req.kv_bits, dtype=dtype, batch=req.batch, snapshots=1
    )
    shard_note = f", {layer_share:.0%} of it on this rank" if req.split.sharded else ""
    items.append(
        PlanItem(
            "target KV cache",
            int(target_kv * layer_share),
            f"{context} + {rollback} positions, {kv_note}" + _state_note(req.target.config, dtype) + shard_note,
        )
    )
    if req.draft is not None:
        window = f", window {req.draft_window}" if req.draft_window else ""
        ratio = draft_tokens_per_target_token(req.target, req.draft)
        if ratio != 1.0:  # a draft with another tokenizer holds the same text in its own tokens
            window += f"; another tokenizer: {ratio:.2f} draft tokens per target token"
        items.append(
            PlanItem(
                "draft KV cache",
                mm.kv_cache_bytes(
                    req.draft.config,
                    math.ceil(context * ratio),
                    2 * rollback if ratio != 1.0 else rollback,  # re-tokenized proposals draft up to 2k + 2
                    req.kv_bits,
                    dtype=dtype,
                    batch=req.batch,
                    window=req.draft_window,
                    snapshots=rollback,  # a recurrent draft keeps its state after each single-token step
                ),
                f"{kv_note}{window}",
            )
        )
    activations = mm.verification_bytes(
        req.target.config, rollback, context, materialized_scores=req.device.backend == "cpu"
    )
    items.append(
        PlanItem("activations", req.batch * activations, f"verify {rollback} positions or a 512-token prefill chunk")
    )
    return items


def total_bytes(req: PlanRequest, context: int | None = None) -> int:
    return sum(item.bytes for item in memory_items(req, context)) + RUNTIME_OVERHEAD


def max_context(req: PlanRequest) -> int | None:
    """The longest context that fits the budget (binary search over the full accounting), or None if none does."""
    limit = req.target.config.get("max_position_embeddings") or 1 << 20
    if total_bytes(req, 1) > req.device.budget_bytes:
        return None
    low, high = 1, limit
    while low < high:
        mid = (low + high + 1) // 2
        if total_bytes(req, mid) <= req.device.budget_bytes:
            low = mid
        else:
            high = mid - 1
    return low


# Cost classes of a change for the user: 0 costs nothing, 1 a little speed or quality, 2 more; within a class,
# the bigger saving comes first.
def _alternatives(req: PlanRequest) -> list[tuple[int, str, str, PlanRequest]]:
    """(cost class, what to change, how: flags of `mlxspec generate`, the changed request)."""
    out = []
    head_dim = mm.Shape.from_config(req.target.config).head_dim if mm.counted_by_arithmetic(req.target.config) else 0
    if not req.kv_bits and mm.kv_group_size_for(head_dim):
        out.append((0, "quantize both KV caches to 8 bits", "--kv-bits 8", replace(req, kv_bits=8)))
        out.append((1, "quantize both KV caches to 4 bits", "--kv-bits 4", replace(req, kv_bits=4)))
    if req.draft is not None and not req.draft_window:
        out.append(
            (
                0,
                "give the draft a 1024-token KV window (it only drafts; exactness is kept)",
                "--draft-window 1024",
                replace(req, draft_window=1024),
            )
        )
    if req.verify_positions > 3:
        out.append((0, "draft fewer tokens per step", "--num-draft 2", replace(req, num_draft=2, tree_nodes=None)))
    if req.draft is not None:
        no_draft = replace(req, draft=None, draft_window=None)
        out.append((1, "draft by prompt lookup instead (no memory)", "--no-draft --lookup", no_draft))
        out.append((1, "use Medusa heads instead of a draft model", "--medusa PATH", replace(no_draft, medusa_heads=4)))
        out.append((2, "drop the draft: plain decoding", "--no-draft", no_draft))
        if not req.draft_bits and not (req.draft.config.get("quantization") or {}):
            out.append((1, "quantize the draft to 4 bits", "--draft-bits 4", replace(req, draft_bits=4)))
    stored_bits = (req.target.config.get("quantization") or {}).get("bits")
    if (req.target_bits or stored_bits or 16) > 4:
        out.append((2, "quantize the target to 4 bits", "--quantize-target 4", replace(req, target_bits=4)))
    return out


def _worth_saving(total: int) -> int:
    """The least a change must save to be advice: 1 MiB, or 0.5% of the plan."""
    return max(2**20, total // 200)


def _recommendation(what: str, how: str, alternative: PlanRequest, base_total: int, budget: int) -> dict:
    alt_total = total_bytes(alternative)
    return {
        "change": what,
        "how": how,
        "total_bytes": alt_total,
        "saving_bytes": base_total - alt_total,
        "fits": alt_total <= budget,
        "max_context": max_context(alternative),
    }


def _merge(base: PlanRequest, changed: PlanRequest) -> PlanRequest:
    """base with every field that `changed` altered relative to the original defaults applied."""
    updates = {
        name: getattr(changed, name)
        for name in ("kv_bits", "draft_window", "num_draft", "tree_nodes", "target_bits", "draft_bits")
        if getattr(changed, name) is not None
    }
    return replace(base, **updates)


def largest_tensor(config: dict) -> int:
    """Elements of a model's largest weight: the embedding (or output layer), an MLP matrix, or a layer's stacked
    experts."""
    params = mm.count_parameters(config)
    text = config.get("text_config") or {}
    get = lambda key: config.get(key, text.get(key)) or 0  # noqa: E731
    hidden = get("hidden_size")
    experts = get("num_local_experts") or get("num_experts") or get("n_routed_experts")
    stacked = experts * (get("moe_intermediate_size") or get("intermediate_size")) * hidden
    return max(params.embedding, params.lm_head, get("intermediate_size") * hidden, stacked)


def embedding_scales_widened(config: dict) -> int:
    """A quantized model's embedding scales and biases (a group's pair) widened to float32 on the CPU, as stored
    bytes count them at 16 bits (loading.py): 42 MB for Gemma 3 270M's 262,144 x 640 at groups of 32."""
    group = (config.get("quantization") or {}).get("group_size", 64)
    return config.get("vocab_size", 0) * config.get("hidden_size", 0) // group * 2 * 4


def load_staging_bytes(req: PlanRequest) -> int:
    """On the CPU backend an unquantized half-precision model is widened to float32 as it loads, a tensor at a
    time: beside the float32 weights, the tensor being cast is alive in its stored half precision too. Measured
    (mx.get_peak_memory, 2026-12-05) the excess over the float32 weights was 0.36, 0.37 and 0.79 GiB for Gemma 3
    270M, Qwen2.5-Coder-0.5B and -1.5B, against their largest tensor's stored 0.31, 0.25 and 0.43 GiB."""
    if req.device.backend != "cpu":
        return 0
    staged = 0
    for meta, bits in ((req.target, req.target_bits), (req.draft, req.draft_bits)):
        if meta is not None and not bits and meta.config.get("quantization") and "GGUF" not in meta.source:
            staged = max(staged, embedding_scales_widened(meta.config))
        if meta is None or bits or meta.config.get("quantization") or not meta.weight_bytes:
            continue
        if meta.weight_bytes * 1.5 < 4 * mm.count_parameters(meta.config).total:  # stored in half precision
            staged = max(staged, 2 * largest_tensor(meta.config))  # the models load one after the other
    return staged


def make_plan(req: PlanRequest) -> Plan:
    items = memory_items(req)
    mlx_bytes = sum(item.bytes for item in items)
    weights = sum(item.bytes for item in items if item.name.endswith("weights"))
    staged = load_staging_bytes(req)
    load_peak = weights + staged  # while loading, before any cache exists
    if load_peak > mlx_bytes:  # a row of its own, so the rows add up to the total
        note = "loading: a tensor's stored half precision beside the float32 weights (transient)"
        items.append(PlanItem("load-time peak", load_peak - mlx_bytes, note))
    items.append(PlanItem("runtime overhead", RUNTIME_OVERHEAD, "MLX, Python, kernels (estimate)"))
    total = max(mlx_bytes, load_peak) + RUNTIME_OVERHEAD
    budget = req.device.budget_bytes
    drafter = sum(i.bytes for i in items if i.name.startswith(("draft", "medusa")))
    plan = Plan(
        request={
            "target": req.target.name,
            "draft": req.draft.name if req.draft else None,
            "medusa_heads": req.medusa_heads,
            "device": req.device.name,
            "device_source": req.device.source,
            "backend": req.device.backend,
            "dtype": compute_dtype(req.device, req.target.config),
            "context": req.context,
            "batch": req.batch,
            "target_bits": req.target_bits,
            "kv_bits": req.kv_bits,
            "num_draft": req.num_draft,
            "tree_nodes": req.tree_nodes,
            "draft_window": req.draft_window,
            "ranks": req.split.ranks,
            "distributed": req.split.mode if req.split.sharded else None,
        },
        items=items,
        mlx_bytes=mlx_bytes,
        total_bytes=total,
        budget_bytes=budget,
        fits=total <= budget,
        max_context={
            "target alone": max_context(replace(req, draft=None, medusa_heads=0)),
            "target + draft": max_context(replace(req, medusa_heads=0)) if req.draft else None,
            "target + medusa": max_context(replace(req, draft=None, medusa_heads=req.medusa_heads or 4)),
        },
        drafter_overhead_bytes=drafter,
        drafter_overhead_percent=100 * drafter / budget,
    )
    if load_peak > mlx_bytes:
        plan.notes.append(
            f"loading peaks at {load_peak / 2**30:.2f} GiB before the caches exist: the float32 weights and the "
            f"tensor being widened, still in half precision ({staged / 2**30:.2f} GiB); the total counts it"
        )
    if req.split.sharded:
        plan.notes.append(
            f"per rank: {req.split.describe()}; each machine needs the memory above (the most loaded rank). The "
            "drafter is whole on every rank, and activations are counted whole (an upper bound)."
        )
    target_vocab = req.target.config.get("vocab_size")
    draft_vocab = req.draft.config.get("vocab_size") if req.draft else None
    if draft_vocab and target_vocab and draft_vocab != target_vocab:
        measured = req.draft.tokenizer_file is not None and req.target.tokenizer_file is not None
        plan.notes.append(
            f"the draft's vocabulary ({draft_vocab} tokens) differs from the target's ({target_vocab}): unless only "
            "the embedding is padded, generate drafts across the tokenizers, and the draft's weights and KV cache "
            "above are its own, "
            + ("at its own tokens for the same text (measured on a sample)" if measured else "at as many tokens")
        )
    if req.device.backend == "cpu" and (req.target_bits or (req.target.config.get("quantization") or {})):
        plan.notes.append(
            "On the CPU a quantized target is read once for up to 32 verified tokens by mlxspec's kernel, but widening "
            "its codes costs arithmetic: on a 2-core AVX2 host 5 tokens cost about 3x one at 4 bits, 2x at 8 "
            "(`mlxspec bench verify-cost` measures this machine)."
        )
    ranked = []
    own_limit = req.target.config.get("max_position_embeddings")
    if plan.fits and own_limit and max_context(req) == own_limit:
        plan.notes.append(f"the model's whole context ({own_limit} tokens) fits; nothing needs to change")
        return plan
    for cost, what, how, alternative in _alternatives(req):
        rec = _recommendation(what, how, alternative, total, budget)
        if rec["saving_bytes"] >= _worth_saving(total):  # a change that saves (next to) nothing is no advice
            ranked.append((cost, -rec["saving_bytes"], rec))
    plan.recommendations = [rec for *_, rec in sorted(ranked, key=lambda item: item[:2])]
    if not plan.fits and not any(r["fits"] for r in plan.recommendations):
        # No single change is enough: stack the combinable ones, cheapest first, until the plan fits.
        combined, hows = req, []
        for cost, _, how, alternative in sorted(_alternatives(req), key=lambda item: item[0]):
            if how in ("--medusa PATH", "--kv-bits 8", "--no-draft", "--no-draft --lookup"):
                continue
            if total - total_bytes(alternative) < _worth_saving(total):
                continue
            combined = _merge(combined, alternative)
            hows.append(how)
            if total_bytes(combined) <= budget:
                break
        if hows:
            together = _recommendation("all of these together", " ".join(hows), combined, total, budget)
            plan.recommendations.append(together)
    elif not plan.fits:
        plan.recommendations.sort(key=lambda r: not r["fits"])  # keep the cost order among those that fit
    fitting = max_context(req)
    if not plan.fits and fitting:
        plan.recommendations.append(
            {
                "change": f"keep the prompt plus --max-tokens within {fitting} tokens",
                "how": f"context <= {fitting}",
                "total_bytes": total_bytes(req, fitting),
                "saving_bytes": total - total_bytes(req, fitting),
                "fits": True,
                "max_context": fitting,
            }
        )
    return plan
