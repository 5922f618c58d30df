"""Mutation check: run the suite against a verifier that always rejects, or accepts one token fewer, and list the
tests that fail. A suite that stays green under a broken verifier guards nothing.

    python scripts/mutate_verifier.py reject [pytest args...]
    python scripts/mutate_verifier.py one-fewer tests/test_drafts_accepted.py tests/test_api.py
"""

from __future__ import annotations

import os
import sys

import pytest

MUTATIONS = ("reject", "one-fewer")


class VerifierMutation:
    """A pytest plugin that swaps the engine's acceptance functions for a mutant for the whole run."""

    def __init__(self, kind: str):
        self.kind = kind

    def pytest_configure(self, config):
        import mlx.core as mx

        import mlxspec.decoding.engine as engine

        chain, deterministic, tree = engine.accept_chain, engine.accept_deterministic_chain, engine.accept_tree_samples

        def fewer(count):
            return mx.maximum(count - 1, 0) if self.kind == "one-fewer" else mx.zeros_like(count)

        def accept_chain(draft_tokens, draft_probs, target_probs, key, greedy=False):
            count, _ = chain(draft_tokens, draft_probs, target_probs, key, greedy)
            count = fewer(count)
            # The token after the kept prefix is drawn from the target's row there, as a rejection would do.
            return count, mx.argmax(target_probs[count]).astype(mx.int32)

        def accept_deterministic_chain(draft_tokens, samples):
            count, _ = deterministic(draft_tokens, samples)
            count = fewer(count)
            return count, samples[count]

        def accept_tree_samples(tokens, parents, samples, max_depth):
            deepest, _ = tree(tokens, parents, samples, max_depth)
            kept = mx.where(deepest > 0, parents[deepest], 0) if self.kind == "one-fewer" else mx.array(0)
            return kept.astype(mx.int32), samples[kept]

        engine.accept_chain = accept_chain
        engine.accept_deterministic_chain = accept_deterministic_chain
        engine.accept_tree_samples = accept_tree_samples


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in MUTATIONS:
        print(f"usage: python scripts/mutate_verifier.py {{{'|'.join(MUTATIONS)}}} [pytest args...]", file=sys.stderr)
        return 2
    os.environ["MLXSPEC_NO_OPENBLAS"] = "1"
    args = sys.argv[2:] or ["tests", "-q", "-x", "--deselect", "tests/test_install.py"]
    # -n 0: in this process, where the plugin patched the engine (xdist workers would not see it).
    return pytest.main([*args, "-n", "0", "-p", "no:cacheprovider"], plugins=[VerifierMutation(sys.argv[1])])


if __name__ == "__main__":
    sys.exit(main())
