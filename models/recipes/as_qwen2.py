"""Re-express a Llama checkpoint as the same function in Qwen2's layout, so mlx-lm's pipeline split (which Qwen2
has and Llama lacks) can be measured on the widened bench target: zero q/k/v biases, the same RoPE base, norms,
tied embeddings. Checks that both compute the same logits.

  python models/recipes/as_qwen2.py --model runs/target-24x768 --out runs/target-24x768-qwen2
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    source, out = Path(args.model), Path(args.out)
    if out.exists():
        raise SystemExit(f"as_qwen2: '{out}' exists; pass another --out or remove it")
    config = json.loads((source / "config.json").read_text())
    if config["model_type"] != "llama" or config["hidden_size"] != config["num_attention_heads"] * config["head_dim"]:
        raise SystemExit("as_qwen2: needs a Llama model whose heads x head_dim equals its hidden size")
    out.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (source / name).exists():
            shutil.copy(source / name, out / name)
    rope = config.get("rope_parameters") or {}
    config.update(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
    )
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = {}
    for path in sorted(glob.glob(str(source / "*.safetensors"))):
        weights.update(mx.load(path))
    kv = config["num_key_value_heads"] * config["head_dim"]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.self_attn."
        for name, size in (("q_proj", config["hidden_size"]), ("k_proj", kv), ("v_proj", kv)):
            weights[prefix + name + ".bias"] = mx.zeros((size,), dtype=weights[prefix + name + ".weight"].dtype)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    tokens = mx.array([[1, 5, 9, 200, 17, 3000, 42, 7]])
    llama, qwen2 = load(str(source))[0], load(str(out))[0]
    gap = mx.abs(llama(tokens) - qwen2(tokens)).max().item()
    print(f"{out}: written; the largest logit difference from {source} is {gap:.2e}")


if __name__ == "__main__":
    main()
