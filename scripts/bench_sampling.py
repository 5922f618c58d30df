"""Time sampled verification at real vocabulary sizes (issue 11, part 4).

Part 1, per vocabulary (32k, 128k, 152k, 262k), K=4, T=0.7, top-p 0.9, Zipf-shaped random logits:
  Leviathan/Chen (--acceptance residual): target to_probs over K+1 rows, the draft's to_probs over K single rows
  (one per draft step), accept_chain, and the same with the whole vocabulary sorted per row (mlx-lm's filters: the
  path before candidate ranking); the coupled rule (the default): the draft's K keyed draws, one per draft step,
  and the target's K+1 keyed draws with the match.
Part 2 (--model): the per-step time split of sampled speculative decoding on a Qwen2.5-0.5B-shaped random target
  with a 2-layer draft of the same shape (float32).

    python scripts/bench_sampling.py [--model] [--kernel auto|off]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

from mlxspec.decoding.acceptance import accept_chain, accept_node_samples
from mlxspec.decoding.draft import Draft
from mlxspec.decoding.sampling import (
    SamplingConfig,
    pick_draft_token,
    sample,
    to_probs,
    to_probs_checked,
    to_probs_sorted,
)
from mlxspec.decoding.verify import target_samples
from mlxspec.kernels import verify as verify_kernel

VOCABS = (32000, 128256, 151936, 262144)
K = 4
CONFIG = SamplingConfig(0.7, top_p=0.9)
QWEN_05B = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}


def zipf_logits(rows: int, vocab: int, seed: int) -> mx.array:
    """Rows shaped like a trained model's: log-probabilities falling as -1.1 log(rank), shuffled, with noise."""
    mx.random.seed(seed)
    base = -1.1 * mx.log(mx.arange(1, vocab + 1).astype(mx.float32))
    return mx.stack([(base + 0.3 * mx.random.normal((vocab,)))[mx.random.permutation(vocab)] * 8 for _ in range(rows)])


def median_ms(fn, repeats: int = 9) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def part_times(vocab: int) -> dict[str, float]:
    target, draft = zipf_logits(K + 1, vocab, 0), zipf_logits(K, vocab, 1)
    key = mx.random.key(0)
    q = to_probs(draft, CONFIG)
    tokens = sample(q, key, False)
    mx.eval(target, draft, q, tokens)

    def accept(p):
        mx.eval(*accept_chain(tokens, q, p, key))

    p_fast, p_sorted = to_probs_checked(target, CONFIG)[0], to_probs_sorted(target, CONFIG)
    mx.eval(p_fast, p_sorted)
    parts = {
        "target probs": median_ms(lambda: mx.eval(to_probs_checked(target, CONFIG))),
        "draft probs x4": median_ms(lambda: [mx.eval(to_probs(draft[i : i + 1], CONFIG)) for i in range(K)]),
        "accept": median_ms(lambda: accept(p_fast)),
    }
    parts["total"] = sum(parts.values())
    sorted_parts = [
        median_ms(lambda: mx.eval(to_probs_sorted(target, CONFIG))),
        median_ms(lambda: [mx.eval(to_probs_sorted(draft[i : i + 1], CONFIG)) for i in range(K)]),
    ]
    parts["total, whole vocabulary sorted"] = sum(sorted_parts) + parts["accept"]
    # The coupled rule (the default): the draft draws each position with its key, the target draws every row with
    # its position's key, and the drafts are matched (no probabilities, no residual)
    keys = mx.random.split(key, K + 1)
    pending = [0]
    chain = Draft(tokens)

    def coupled_target():
        samples, short = target_samples(target, CONFIG, keys)
        mx.eval(*accept_node_samples(chain, pending, samples), short)

    parts["coupled: draft draws x4"] = median_ms(
        lambda: [mx.eval(pick_draft_token(draft[i], CONFIG, 1, keys[i])[0]) for i in range(K)]
    )
    parts["coupled: target draws and match"] = median_ms(coupled_target)
    parts["coupled total"] = parts["coupled: draft draws x4"] + parts["coupled: target draws and match"]
    return parts


LOGIT_GAIN = 12.0


def model_split(engines: list, steps: int = 12) -> dict[str, float]:
    from mlx_lm.utils import _get_classes

    from mlxspec.decoding.assembly import build_engine
    from mlxspec.drafting.factory import make_drafter
    from mlxspec.options import DecodeOptions

    def build(config: dict, seed: int):
        model_class, args_class = _get_classes(config)
        mx.random.seed(seed)
        model = model_class(args_class.from_dict(config))
        # Random weights give near-uniform rows, whose top-p set spans most of the vocabulary (every step would
        # be redone fully sorted); a larger final-norm gain spreads the logits like a trained model's.
        model.model.norm.weight = model.model.norm.weight * LOGIT_GAIN
        model.set_dtype(mx.float32)
        mx.eval(model.parameters())
        return model

    target = build(QWEN_05B, 0)
    draft = build({**QWEN_05B, "num_hidden_layers": 2}, 1)
    options = DecodeOptions(temperature=CONFIG.temperature, top_p=CONFIG.top_p, num_draft=K)
    backend, _ = verify_kernel.resolve(options.kernel)
    engine = build_engine(verify_kernel.routed_view(target, backend), make_drafter(options, draft_model=draft), options)
    engines.append(engine)
    engine.prefill(list(range(1, 65)))
    engine.step(K + 1)  # warm up
    totals: dict[str, float] = {}
    engine.profile = totals
    for _ in range(steps):
        engine.step(K + 1)
    return {phase: 1e3 * seconds / steps for phase, seconds in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="store_true", help="also time a Qwen2.5-0.5B-shaped random target's step")
    args = parser.parse_args()
    ops = "kernel row ops" if verify_kernel.row_ops() is not None else "MLX ops (no kernel)"
    print(f"# K={K}, T={CONFIG.temperature}, top-p {CONFIG.top_p}; {ops}; median ms of 9")
    for vocab in VOCABS:
        parts = part_times(vocab)
        print(f"vocab {vocab:7d}: " + ", ".join(f"{name} {ms:.1f}" for name, ms in parts.items()))
    if args.model:
        engines: list = []
        split = model_split(engines)
        print(
            f"# Qwen2.5-0.5B-shaped random target (float32, final-norm gain {LOGIT_GAIN}), 2-layer draft of the same "
            "shape; ms per step (profiling adds syncs):"
        )
        print(", ".join(f"{name} {ms:.1f}" for name, ms in split.items()))
        print(f"# steps redone with the whole vocabulary sorted: {engines[0].sorted_fallbacks}")


if __name__ == "__main__":
    main()
