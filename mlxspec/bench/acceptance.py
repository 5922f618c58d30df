"""Acceptance by depth of every drafter on held-out prompts: tau (tokens per target call) and alpha_d, the share of
steps that keep depth d among those that drafted it with depth d-1 kept, at T=0 and T=0.7.

No timings here (those are `mlxspec bench`): the counts depend only on the seeds. Example:

    python scripts/acceptance_by_depth.py --eagle models/eagle --medusa models/medusa --depth 6 --json out.json
    python scripts/acceptance_by_depth.py --eagle my-eagle3 --no-draft-model --depth 6 --json out.json
    python scripts/acceptance_by_depth.py --medusa models/medusa --no-draft-model --depth 4 --medusa-trees 8:2,16:4
    python scripts/acceptance_by_depth.py --dflash models/dflash --depth 7 --ddtrees 8:2,15:3 --json out.json
"""

from __future__ import annotations

import argparse
import json

import mlx.core as mx

from mlxspec.bench.runner import heldout_prompts
from mlxspec.decoding.assembly import build_engine
from mlxspec.drafting.eagle3_files import load_eagle_head
from mlxspec.drafting.factory import make_drafter
from mlxspec.drafting.medusa import load_medusa
from mlxspec.kernels import verify as verify_kernel
from mlxspec.loading import DEFAULT_DRAFT, DEFAULT_TARGET, load_model
from mlxspec.options import DecodeOptions


def measure(target, options: DecodeOptions, prompts, max_tokens: int, **drafter_args) -> dict:
    kept_at = [0] * 65  # steps that kept at least d drafts
    drafted_at = [0] * 65  # steps that drafted depth d with depth d-1 kept
    calls = tokens = 0
    backend, _ = verify_kernel.resolve(options.kernel)
    for seed, prompt in enumerate(prompts):
        drafter = make_drafter(options, target_model=target.model, **drafter_args)
        engine = build_engine(verify_kernel.routed_view(target.model, backend), drafter, options, seed=seed)
        if True:  # (the routed view is built once; no block to enter)
            engine.prefill(prompt)
            produced = 0
            while produced < max_tokens:
                step = engine.step(max_tokens - produced)
                produced += len(step.tokens)
                depth = options.depth if step.drafted else 0
                for d in range(1, depth + 1):
                    drafted_at[d] += step.accepted >= d - 1
                    kept_at[d] += step.accepted >= d
        calls += engine.target_calls
        tokens += produced
    depth = options.depth
    alpha = [kept_at[d] / drafted_at[d] if drafted_at[d] else 0.0 for d in range(1, depth + 1)]
    return {"tau": tokens / calls, "alpha_by_depth": [round(a, 3) for a in alpha], "target_calls": calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eagle", default=None)
    parser.add_argument("--medusa", default=None)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--trees", default="8:2,16:4,24:4", help="EAGLE-2 trees as nodes:beam, comma-separated")
    parser.add_argument("--medusa-trees", default="8:2,16:4", help="Medusa/Hydra sparse trees as nodes:topk")
    parser.add_argument("--dflash", default=None, help="a DFlash drafter (chains, and the --ddtrees)")
    parser.add_argument("--ddtrees", default="8:2,15:3,24:4", help="DDTrees as nodes:topk, comma-separated")
    parser.add_argument("--no-draft-model", action="store_true", help="skip the draft-model chain")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    target = load_model(DEFAULT_TARGET)
    draft = load_model(DEFAULT_DRAFT)
    prompts = heldout_prompts(target.tokenizer, args.num_prompts, 128)
    eagle = load_eagle_head(args.eagle, target) if args.eagle else None  # mlxspec's EAGLE head or an EAGLE-3 head
    medusa = load_medusa(args.medusa, target.path) if args.medusa else None
    dflash = None
    if args.dflash:
        from mlxspec.drafting.dflash_files import load_dflash

        dflash = load_dflash(args.dflash, target)
    rows = {}
    for temperature in (0.0, 0.7):
        chain = DecodeOptions(temperature=temperature, num_draft=args.depth, lookup=False)
        runs = {} if args.no_draft_model else {"draft model chain": (chain, {"draft_model": draft.model})}
        if dflash is not None:
            runs["dflash chain"] = (chain, {"dflash": dflash})
            for spec in args.ddtrees.split(","):
                nodes, topk = (int(x) for x in spec.split(":"))
                runs[f"dflash ddtree {nodes}n top{topk}"] = (
                    chain.updated(tree_topk=topk, tree_nodes=nodes),
                    {"dflash": dflash},
                )
        if eagle is not None:
            runs["eagle chain"] = (chain, {"feature_head": eagle})
            for spec in args.trees.split(","):
                nodes, beam = (int(x) for x in spec.split(":"))
                tree = chain.updated(tree_topk=beam, tree_nodes=nodes)
                runs[f"eagle tree {nodes}n beam {beam}"] = (tree, {"feature_head": eagle})
        if medusa is not None:
            heads_chain = chain.updated(num_draft=medusa.config.num_heads)
            runs["medusa chain"] = (heads_chain, {"medusa": medusa})
            for spec in args.medusa_trees.split(","):
                nodes, topk = (int(x) for x in spec.split(":"))
                tree = heads_chain.updated(tree_topk=topk, tree_nodes=nodes)
                runs[f"medusa tree {nodes}n top{topk}"] = (tree, {"medusa": medusa})
        for name, (options, drafter_args) in runs.items():
            result = measure(target, options.validate(), prompts, args.max_tokens, **drafter_args)
            rows[f"{name} T={temperature}"] = result
            print(f"{name:28s} T={temperature}: tau {result['tau']:.2f}  alpha by depth {result['alpha_by_depth']}")
            mx.clear_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
