"""`mlxspec bench --plot`: speedup against k and tok/s per mode, one row per temperature."""

from __future__ import annotations

from mlxspec.bench.runner import ModeResult


def plot(results_by_temp: dict[str, list[ModeResult]], path: str) -> None:
    """speedup vs k for every family measured at several fixed k, and tok/s per mode, one row per temperature."""
    import re

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(len(results_by_temp), 2, figsize=(13, 4.5 * len(results_by_temp)), squeeze=False)
    for row, (temp, results) in enumerate(results_by_temp.items()):
        families: dict[str, list[tuple[int, float]]] = {}  # every chain family measured at a fixed k
        for r in results:
            if m := re.fullmatch(r"(.+?) k=(\d+)", r.mode):
                families.setdefault(m.group(1), []).append((int(m.group(2)), r.speedup))
        for family, points in families.items():
            if len(points) > 1 or len(families) == 1:
                axes[row][0].plot(*zip(*sorted(points)), marker="o", label=family)
        axes[row][0].xaxis.set_major_locator(MaxNLocator(integer=True))  # k is a whole number of tokens
        axes[row][0].axhline(1.0, color="grey", lw=0.8)
        axes[row][0].set(xlabel="draft length k", ylabel="speedup vs plain", title=f"temperature {temp}")
        axes[row][0].legend()
        axes[row][1].barh([r.mode for r in results], [r.tokens_per_second for r in results])
        axes[row][1].set(xlabel="tokens/s", title=f"temperature {temp}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
