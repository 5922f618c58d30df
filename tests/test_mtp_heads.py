"""Native MTP heads: tiny random checkpoints written with each family's real tensor names (vLLM's *_mtp.py) load
into the head mlx-lm's own layer expects, draft exactly (greedy and chi-square), and bad ones are refused by name."""

import json

import mlx.core as mx
import numpy as np
import pytest
from family_sweep import from_config, tiny_configs
from helpers import assert_greedy_equal, mlx_lm_greedy, speculative_tokens
from mlx.utils import tree_flatten
from stats import ALPHA, chi_square_pvalue
from test_engine_exactness import exact_joint

from mlxspec import UserError
from mlxspec.decoding.sampling import SamplingConfig
from mlxspec.drafting.heads.feature_drafter import FeatureDrafter
from mlxspec.drafting.heads.feature_head import HeadOnTarget
from mlxspec.drafting.heads.mtp_weights import DEEPSEEK, LAYOUTS, _block_config, load_mtp_head, text_config
from mlxspec.loading import LoadedModel
from mlxspec.model_files import lazy_model

FAMILIES = ["deepseek_v3", "glm4_moe", "qwen3_next", "qwen3_5", "mimo"]
# The names each family's checkpoint gives its MTP head (N = num_hidden_layers), from vLLM's loaders.
HEAD_NAMES = {
    "deepseek_v3": [
        "model.layers.{n}.enorm.weight",
        "model.layers.{n}.hnorm.weight",
        "model.layers.{n}.eh_proj.weight",
        "model.layers.{n}.shared_head.norm.weight",
    ],
    "qwen3_next": [
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.fc.weight",
        "mtp.norm.weight",
    ],
    "mimo": [
        "model.mtp_layers.0.token_layernorm.weight",
        "model.mtp_layers.0.hidden_layernorm.weight",
        "model.mtp_layers.0.input_proj.weight",
        "model.mtp_layers.0.final_layernorm.weight",
    ],
}
HEAD_NAMES["glm4_moe"] = HEAD_NAMES["deepseek_v3"]
HEAD_NAMES["qwen3_5"] = HEAD_NAMES["qwen3_next"]


def hf_block_tensors(family: str, twin_layer, config: dict) -> dict[str, mx.array]:
    """The layer's weights as the original checkpoint stores them: one tensor per expert, MLA's kv_b_proj whole,
    and Qwen's (1 + w) norms as w: the inverse of mlx-lm's conversion."""
    out = {}
    for name, value in tree_flatten(twin_layer.parameters()):
        if ".switch_mlp." in name:
            for e in range(value.shape[0]):
                out[name.replace("switch_mlp.", f"experts.{e}.")] = value[e]
        elif name.endswith("embed_q.weight"):
            wv = dict(tree_flatten(twin_layer.parameters()))[name.replace("embed_q", "unembed_out")]
            kv_b = mx.concatenate([value.swapaxes(-1, -2), wv], axis=1)  # [H, nope + v, kv_lora]
            out[name.replace("embed_q", "kv_b_proj")] = kv_b.reshape(-1, kv_b.shape[-1])
        elif name.endswith("unembed_out.weight"):
            continue
        elif LAYOUTS[family].gemma_norms and value.ndim == 1 and name.endswith("norm.weight"):
            out[name] = value - 1.0
        else:
            out[name] = value
    return out


def write_checkpoint(family, target, directory, moe=True, drop=None, reshape=None):
    """The target's directory with an MTP shard of random weights under the family's real names; returns the
    mlx-lm layer those weights should load into."""
    config = text_config(target.config)
    layout = LAYOUTS[family]
    n = config["num_hidden_layers"]
    prefix = layout.prefix.format(n=n)
    twin = lazy_model(_block_config(config, layout, moe))
    mx.random.seed(5)
    mx.eval(twin.parameters())
    dims = config["hidden_size"]
    names = [name.format(n=n) for name in HEAD_NAMES[family]]
    tensors = {
        names[0]: mx.random.uniform(0.5, 1.5, (dims,)),
        names[1]: mx.random.uniform(0.5, 1.5, (dims,)),
        names[2]: mx.random.normal((dims, 2 * dims)) * 0.2,
        names[3]: mx.random.uniform(0.5, 1.5, (dims,)),
    }
    tensors.update({prefix + layout.block + k: v for k, v in hf_block_tensors(family, twin.layers[0], config).items()})
    if layout is DEEPSEEK:  # copies of the shared embedding and head sit in the MTP layer too
        tensors[prefix + "embed_tokens.weight"] = mx.zeros((config["vocab_size"], dims))
        tensors[prefix + "shared_head.head.weight"] = mx.zeros((config["vocab_size"], dims))
    if drop:
        del tensors[drop.format(n=n)]
    if reshape:
        tensors[reshape.format(n=n)] = mx.zeros((3, 3))
    directory.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(directory / "model-mtp.safetensors"), tensors)
    weight_map = {k: "model-mtp.safetensors" for k in tensors}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return twin.layers[0], tensors


def tiny_target(family, tmp_path, **overrides):
    config = {**tiny_configs(family)[0], **overrides}
    model = from_config(config)
    return LoadedModel(model, None, config, tmp_path / family)


@pytest.mark.parametrize("family", FAMILIES)
def test_native_mtp_heads_load_with_their_real_names_and_draft_exactly(family, tmp_path):
    target = tiny_target(family, tmp_path)
    moe = family != "mimo" and family != "qwen3_5"
    layer, tensors = write_checkpoint(family, target.model, target.path, moe=moe)
    head = load_mtp_head(target)
    want = dict(tree_flatten(layer.parameters()))
    got = dict(tree_flatten(head.block.parameters()))
    assert want.keys() == got.keys()
    assert all(mx.allclose(want[k], got[k], atol=1e-5).item() for k in want)  # norms shifted back exactly
    fc_name = HEAD_NAMES[family][2].format(n=target.config["num_hidden_layers"])
    assert mx.array_equal(head.fc.weight, tensors[fc_name]).item()
    totals, prompt = {}, [1, 2, 3, 4, 5, 6]
    drafter = FeatureDrafter(HeadOnTarget(head, target.model), SamplingConfig())
    got = speculative_tokens(target.model, None, prompt, 16, num_draft=3, drafter=drafter, totals=totals)
    assert_greedy_equal(target.model, prompt, got, mlx_lm_greedy(target.model, prompt, 16))
    assert totals["drafted"] > 0


def test_a_quantized_mtp_head_still_drafts_exactly(tmp_path):
    import mlx.nn as nn

    target = tiny_target("mimo", tmp_path)
    write_checkpoint("mimo", target.model, target.path, moe=False)
    head = load_mtp_head(target, bits=8)
    assert isinstance(head.fc, nn.QuantizedLinear)
    prompt, drafter = [1, 2, 3, 4], FeatureDrafter(HeadOnTarget(head, target.model), SamplingConfig())
    got = speculative_tokens(target.model, None, prompt, 12, num_draft=3, drafter=drafter)
    assert_greedy_equal(target.model, prompt, got, mlx_lm_greedy(target.model, prompt, 12))


@pytest.mark.heavy  # the sampled-chain path is FeatureDrafter's, whose chi-square tests run in CI (test_feature_heads)
def test_mtp_samples_follow_the_target_distribution(tmp_path):
    """Chi-square of 2000 seeded runs of a DeepSeek-V3 MTP chain sampled from its q at T=1; false alarm 1e-3."""
    target = tiny_target("deepseek_v3", tmp_path, vocab_size=8)
    write_checkpoint("deepseek_v3", target.model, target.path)
    head = load_mtp_head(target)
    sampling, prompt, length = SamplingConfig(1.0), [1, 2, 1], 3
    counts, totals = np.zeros([8] * length), {}
    for seed in range(2000):
        drafter = FeatureDrafter(HeadOnTarget(head, target.model), sampling)
        out = speculative_tokens(
            target.model,
            None,
            prompt,
            length,
            num_draft=2,
            sampling=sampling,
            seed=seed,
            drafter=drafter,
            totals=totals,
        )
        counts[tuple(out)] += 1
    assert totals["accepted"] > 100
    assert chi_square_pvalue(counts, exact_joint(target.model, prompt, sampling, length)) > ALPHA


def test_missing_or_malformed_mtp_tensors_are_refused_by_name(tmp_path):
    target = tiny_target("qwen3_next", tmp_path)
    write_checkpoint("qwen3_next", target.model, target.path, drop="mtp.pre_fc_norm_hidden.weight")
    with pytest.raises(UserError, match="lacks mtp.pre_fc_norm_hidden.weight"):
        load_mtp_head(target)
    write_checkpoint("qwen3_next", target.model, target.path, reshape="mtp.layers.0.self_attn.o_proj.weight")
    with pytest.raises(UserError, match="do not fit a qwen3_next MTP layer"):
        load_mtp_head(target)
    other = tiny_target("deepseek_v3", tmp_path)
    other.path.mkdir(parents=True)
    with pytest.raises(UserError, match=r"holds no MTP tensors \(model.layers.4.\*\); mlx_lm.convert drops them"):
        load_mtp_head(other)
    llama = LoadedModel(None, None, {"model_type": "llama", "num_hidden_layers": 2}, tmp_path)
    with pytest.raises(UserError, match="model_type 'llama' has no native MTP head"):
        load_mtp_head(llama)


def test_from_a_hub_repo_only_the_shards_holding_mtp_tensors_are_fetched(tmp_path, monkeypatch):
    import huggingface_hub

    target = tiny_target("mimo", tmp_path)
    _, tensors = write_checkpoint("mimo", target.model, tmp_path / "repo", moe=False)
    mx.save_safetensors(str(tmp_path / "repo" / "model-main.safetensors"), {"model.norm.weight": mx.ones((4,))})
    index = json.loads((tmp_path / "repo" / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "model-main.safetensors"
    (tmp_path / "repo" / "model.safetensors.index.json").write_text(json.dumps(index))
    fetched = []

    def fake_download(repo, filename):
        assert repo == "XiaomiMiMo/MiMo-7B-RL"
        fetched.append(filename)
        return str(tmp_path / "repo" / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    head = load_mtp_head(target, "XiaomiMiMo/MiMo-7B-RL")
    assert fetched == ["model.safetensors.index.json", "model-mtp.safetensors"]
    assert mx.array_equal(head.fc.weight, tensors["model.mtp_layers.0.input_proj.weight"]).item()


def test_an_mtp_head_keeps_its_precision_unless_asked_and_mtp_bits_needs_a_head(tmp_path, cli_run, tiny_dirs):
    """Quantizing an MTP head costs acceptance (MTPLX: MoE acceptance from ~80% to 5-11% at 4 bits): it stays in
    float unless --mtp-bits asks, even on a quantized target; --mtp-bits without an MTP head is refused."""
    import mlx.nn as nn

    import mlxspec

    target = tiny_target("mimo", tmp_path)
    write_checkpoint("mimo", target.model, target.path, moe=False)
    head = load_mtp_head(target)
    assert type(head.fc) is nn.Linear and head.fc.weight.dtype in (mx.float32, mx.bfloat16)
    code, _, err = cli_run("generate", "ab", "--model", tiny_dirs["target"], "--mtp-bits", "4")
    assert code == 2 and "--mtp-bits 4 quantizes an MTP head, and this run has none; pass --mtp too" in err
    with pytest.raises(mlxspec.UserError, match="mtp_bits 8 quantizes an MTP head"):
        mlxspec.load(tiny_dirs["target"], mtp_bits=8)


def split_sidecar(checkpoint: dict, directory, target_config: dict, quantize: bool = False) -> None:
    """What mlx-vlm's `split_mtp` writes for a Qwen3.5 target (qwen3_5_mtp/split.py): config.json with model_type
    qwen3_5_mtp and the text_config; model.safetensors without the `mtp.` prefix, norms shifted to MLX's (1 + w),
    and, with quantize, its matrices affine-quantized with a `quantization` entry."""
    shifted = ("norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")  # split.py's suffixes
    tensors = {}
    for name, value in checkpoint.items():
        key = name.removeprefix("mtp.")
        tensors[key] = value + 1.0 if value.ndim == 1 and key.endswith(shifted) else value
    config = {"model_type": "qwen3_5_mtp", "text_config": target_config, "block_size": 3}
    if quantize:
        for key in [k for k, v in tensors.items() if v.ndim == 2 and v.shape[-1] % 32 == 0]:
            w, scales, biases = mx.quantize(tensors.pop(key), group_size=32, bits=8)
            stem = key.removesuffix(".weight")
            tensors |= {f"{stem}.weight": w, f"{stem}.scales": scales, f"{stem}.biases": biases}
        config["quantization"] = {"group_size": 32, "bits": 8, "mode": "affine"}
    directory.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(directory / "model.safetensors"), tensors, metadata={"format": "mlx"})
    (directory / "config.json").write_text(json.dumps(config))


def test_an_mtp_sidecar_loads_as_the_head_in_the_checkpoint_does_and_drafts_exactly(tmp_path):
    """mlx-community conversions strip mtp.*; mlx-vlm splits the head into its own qwen3_5_mtp checkpoint. That
    sidecar loads into the same head as the original checkpoint's tensors (quantized too), and drafts exactly; a
    sidecar split from another model is refused by name."""
    target = tiny_target("qwen3_5", tmp_path)
    _, checkpoint = write_checkpoint("qwen3_5", target.model, tmp_path / "original", moe=False)
    from_original = load_mtp_head(target, tmp_path / "original")
    split_sidecar(checkpoint, tmp_path / "sidecar", text_config(target.config))
    from_sidecar = load_mtp_head(target, tmp_path / "sidecar")
    want, got = dict(tree_flatten(from_original.parameters())), dict(tree_flatten(from_sidecar.parameters()))
    assert want.keys() == got.keys() and all(mx.array_equal(want[k], got[k]).item() for k in want)
    split_sidecar(checkpoint, tmp_path / "sidecar-q8", text_config(target.config), quantize=True)
    quantized = load_mtp_head(target, tmp_path / "sidecar-q8")
    assert "fc.scales" in dict(tree_flatten(quantized.parameters()))  # it keeps the precision it was split in
    prompt = [1, 2, 3, 4, 5, 6]
    for head in (from_sidecar, quantized):
        totals = {}
        drafter = FeatureDrafter(HeadOnTarget(head, target.model), SamplingConfig())
        got = speculative_tokens(target.model, None, prompt, 16, num_draft=3, drafter=drafter, totals=totals)
        assert_greedy_equal(target.model, prompt, got, mlx_lm_greedy(target.model, prompt, 16))
        assert totals["drafted"] > 0
    hidden = text_config(target.config)["hidden_size"]
    split_sidecar(checkpoint, tmp_path / "other", {**text_config(target.config), "hidden_size": 2 * hidden})
    with pytest.raises(UserError, match=f"split from a model with hidden_size={2 * hidden}"):
        load_mtp_head(target, tmp_path / "other")
