"""`mlxspec bench verify-cost`: the v(n) curve, what one target forward over n tokens costs against one token, on
this device, and the draft length it implies at several acceptance rates.

The curve is measured fresh and only reported: the curve `-k auto` trusts is kept apart (costs.cached_curve), so
a benchmark run on a busy machine never replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxspec.bench.steps import machine

SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class VerifyCostConfig:
    model: str | None = None
    draft: str | None = None  # None: the embedded draft with the embedded target
    max_tokens: int = 32
    context: int = 256
    repeats: int = 7
    kernel: str = "auto"
    formats: bool = False  # also each weight format's GiB/s and v(n) beside the machine's read (format_cost.py)


def run_verify_cost(config: VerifyCostConfig, echo=print) -> dict:
    """Measure and print the curve; the report holds milliseconds per size and the implied draft lengths."""
    from mlxspec.decoding.costs import best_draft_length, expected_speedup, measure_curve
    from mlxspec.kernels import verify as verify_kernel
    from mlxspec.loading import DEFAULT_DRAFT, DEFAULT_TARGET, load_model

    target = load_model(config.model or DEFAULT_TARGET)
    draft_path = config.draft or (DEFAULT_DRAFT if config.model is None else None)
    draft = load_model(draft_path) if draft_path else None
    sizes = tuple(n for n in SIZES if n <= config.max_tokens)
    check_context(config.context, max(sizes), [m for m in (target, draft) if m is not None])
    backend, status = verify_kernel.resolve(config.kernel)
    view = verify_kernel.routed_view(target.model, backend)
    curve = measure_curve(view, draft.model if draft else None, sizes, config.context, config.repeats)
    base = curve.target[min(curve.target)]
    kernel_text = f"verify kernel: {backend.name}" if backend is not None else f"verify kernel {status}"
    echo(
        f"verification cost at context {curve.context} ({curve.blas} BLAS, {kernel_text}), median of {config.repeats}:"
    )
    echo(f"{'tokens':>8s} {'ms':>9s} {'x one token':>12s}")
    for n, seconds in sorted(curve.target.items()):
        echo(f"{n:8d} {seconds * 1e3:9.2f} {seconds / base:12.2f}")
    best = {}
    if draft is not None:
        echo(f"draft, one token: {curve.draft_one * 1e3:.2f} ms ({curve.draft_one / base:.2f} x target)")
        echo("best draft length (Leviathan's expected speedup) by acceptance rate:")
        for alpha in (0.3, 0.5, 0.7, 0.9):
            k = best_draft_length(curve, alpha, max(1, max(sizes) - 1))
            best[str(alpha)] = {"k": k, "expected_speedup": round(expected_speedup(curve, alpha, k), 3)}
            echo(f"  alpha {alpha:.1f}: k={k}, expected speedup {best[str(alpha)]['expected_speedup']:.2f}x")
    report = {
        "machine": machine(),
        "context": curve.context,
        "kernel": backend.name if backend is not None else "none",
        "target_ms": {str(n): round(t * 1e3, 4) for n, t in sorted(curve.target.items())},
        "draft_one_ms": round(curve.draft_one * 1e3, 4),
        "best_draft_length": best,
    }
    if config.formats:
        from mlxspec.bench.format_cost import run_format_cost

        threads = backend.threads if backend is not None and hasattr(backend, "threads") else 1
        report["formats"] = run_format_cost(view, sizes, config.repeats, threads, echo)
    return report


def kv_cache_bytes(config: dict, tokens: int) -> int:
    """The float32 KV cache of `tokens` tokens for a model with this config.json (a bound: sliding layers hold
    less)."""
    text = config.get("text_config") or {}
    get = lambda key, default=None: config.get(key, text.get(key, default))  # noqa: E731
    layers = get("num_hidden_layers", 0) or 0
    heads = get("num_attention_heads", 1) or 1
    kv_heads = get("num_key_value_heads", heads) or heads
    head_dim = get("head_dim") or (get("hidden_size", 0) or 0) // heads
    return int(layers) * int(kv_heads) * int(head_dim) * 2 * 4 * tokens


def check_context(context: int, largest: int, models: list) -> None:
    """Refuse a context the models cannot hold, or whose caches would not fit in this machine's free memory."""
    from mlxspec.errors import UserError
    from mlxspec.platform import available_memory

    for model in models:
        limit = model.context_length
        if limit is not None and context + largest > limit:
            raise UserError(
                f"--context {context} plus the largest forward ({largest} tokens) exceeds the context of "
                f"'{model.path.name}' ({limit} tokens); use --context {max(1, limit - largest)} or less"
            )
    need = sum(kv_cache_bytes(model.config, context + largest) for model in models)
    free = available_memory()
    if free is not None and need > 0.8 * free:
        raise UserError(
            f"--context {context} needs about {need / 2**30:.1f} GiB of KV cache, more than this machine's free "
            f"memory allows ({free / 2**30:.1f} GiB free); use a smaller --context"
        )


def plot_verify_cost(report: dict, path: str) -> None:
    """v(n) against n, with the line of n times one token for comparison."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [int(n) for n in report["target_ms"]]
    ms = list(report["target_ms"].values())
    fig, axis = plt.subplots(figsize=(6, 4))
    axis.plot(sizes, [m / ms[0] for m in ms], marker="o", label="measured v(n)")
    axis.plot(sizes, sizes, color="grey", lw=0.8, ls="--", label="n x one token")
    axis.set(xscale="log", yscale="log", xlabel="tokens verified in one forward", ylabel="cost / one token")
    axis.set_xticks(sizes, [str(n) for n in sizes])
    axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axis.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    axis.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axis.set_title(f"verification cost, {report['machine']}", fontsize=9)
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
