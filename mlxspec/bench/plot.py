"""`mlxspec bench --plot`: speedup against k and tok/s per mode, one row per temperature."""

from __future__ import annotations

from mlxspec.bench.runner import ModeResult


def plot(results_by_temp: dict[str, list[ModeResult]], path: str) -> None:
    """speedup vs K for the draft-model modes, and tok/s per mode, one row per temperature."""
    import re

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results_by_temp), 2, figsize=(13, 4.5 * len(results_by_temp)), squeeze=False)
    for row, (temp, results) in enumerate(results_by_temp.items()):
        for prefix in ("mlxspec draft k=", "mlx-lm speculative k="):
            points = sorted(
                (int(m.group(1)), r.speedup)
                for r in results
                if (m := re.fullmatch(re.escape(prefix) + r"(\d+)", r.mode))
            )
            if points:
                axes[row][0].plot(*zip(*points), marker="o", label=prefix.rstrip(" k="))
        axes[row][0].axhline(1.0, color="grey", lw=0.8)
        axes[row][0].set(xlabel="draft length k", ylabel="speedup vs plain", title=f"temperature {temp}")
        axes[row][0].legend()
        axes[row][1].barh([r.mode for r in results], [r.tokens_per_second for r in results])
        axes[row][1].set(xlabel="tokens/s", title=f"temperature {temp}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
