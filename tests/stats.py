"""Chi-square goodness-of-fit helpers shared by the distribution tests.

Each test uses a fixed seed, so it is deterministic; the stated false-alarm rate is the probability that an exact
sampler fails it for a random seed. With ALPHA = 1e-3 per test and fewer than 20 such tests, the suite's chance of a
false alarm under any seed is below 2%.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

ALPHA = 1e-3


def chi_square_pvalue(counts: np.ndarray, expected_probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson chi-square p-value; cells expecting fewer than min_expected samples are pooled into one."""
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(expected_probs, dtype=np.float64).ravel()
    probs = probs / probs.sum()
    n = counts.sum()
    expected = probs * n
    small = expected < min_expected
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
        if expected[-1] == 0:
            if counts[-1] > 0:
                return 0.0  # samples landed where the distribution has no mass at all
            counts, expected = counts[:-1], expected[:-1]
    dof = len(counts) - 1
    if dof < 1:
        return 1.0
    statistic = ((counts - expected) ** 2 / expected).sum()
    return float(stats.chi2.sf(statistic, dof))
