"""Tiny random models of every family the installed mlx-lm ships, for the family sweep (test_families.py and
scripts/sweep_families.py).

A family's tiny config is the one mlx-lm's own tests build (family_configs.json, extracted by
scripts/extract_family_configs.py) with its vocabulary cut to VOCAB; a family those tests do not cover gets SMALL
(common size fields set small; ModelArgs.from_dict ignores names a family does not have) plus OVERRIDES."""

from __future__ import annotations

import importlib
import json
import pkgutil
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from tiny import LINEAR_ATTENTION

from mlxspec.drafting.lookup.drafter import PromptLookupDrafter

VOCAB = 64

SMALL = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "layer_norm_eps": 1e-5,
    "norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    # mixture of experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "n_shared_experts": 1,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    # multi-head latent attention
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    # sliding windows
    "sliding_window": 8,
    # linear attention and state-space layers
    **LINEAR_ATTENTION,
    "state_size": 4,
    "conv_kernel": 4,
    "time_step_rank": 4,
    "mamba_d_state": 4,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_n_heads": 4,
    "mamba_d_head": 16,
    "n_groups": 1,
    "ssm_state_size": 4,
    "expand": 2,
    # GPT-2 style names
    "n_embd": 32,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 512,
    "n_ctx": 512,
    "n_inner": 64,
}

DROP = "<drop>"  # an override value that removes the key
# mlx-lm's first llama config is its sliding-attention test; the sweep's llama is the plain Llama 3 layout.
# Wrappers around a text model (vision-language checkpoints) get SMALL as their text config.
OVERRIDES: dict[str, dict] = {
    "llama": {"sliding_window": DROP, "layer_types": DROP},
    "gemma3": {"text_config": {**SMALL, "model_type": "gemma3_text", "sliding_window_pattern": 2}},
    "mistral3": {"text_config": {**SMALL, "model_type": "mistral"}},
    "falcon_h1": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "head_dim": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "mamba_n_heads": 4,
        "mamba_d_head": 16,
        "mamba_d_ssm": 64,
        "mamba_d_state": 8,
        "mamba_chunk_size": 16,
        "num_hidden_layers": 2,
    },
    "olmo_hybrid": {"linear_allow_neg_eigval": False, "attention_bias": False},
    "cohere2": {
        "num_hidden_layers": 4,
        "sliding_window_pattern": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
}
MLX_LM_CONFIGS = json.loads((Path(__file__).parent / "family_configs.json").read_text())


def family_names() -> list[str]:
    """Every model_type module of the installed mlx-lm that defines Model and ModelArgs, sorted."""
    import mlx_lm.models as models

    names = []
    for module in pkgutil.iter_modules(models.__path__):
        try:
            mod = importlib.import_module(f"mlx_lm.models.{module.name}")
        except BaseException:  # noqa: BLE001 - olmo exits when ai2-olmo is missing
            names.append(module.name)
            continue
        if hasattr(mod, "Model") and hasattr(mod, "ModelArgs"):
            names.append(module.name)
    return sorted(names)


# Width fields cut further in mlx-lm's test configs (some are 1024 wide); a family whose config then fails to build
# keeps its own widths.
SHRINK = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "ffn_hidden_size": 128,
    "expert_ffn_hidden_size": 64,
    "n_embd": 64,
    "n_inner": 128,
    "n_head": 4,
    "d_model": 64,
    "block_dim": 64,
    "block_ff_dim": 128,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "sliding_window": 8,
    "max_position_embeddings": 1024,
}


def tiny_configs(family: str) -> list[dict]:
    """Configs to try, smallest first."""
    if family not in MLX_LM_CONFIGS:
        return [{**SMALL, **OVERRIDES.get(family, {}), "model_type": family}]
    overrides = OVERRIDES.get(family, {})
    config = {"model_type": family, **MLX_LM_CONFIGS[family], "vocab_size": VOCAB}
    shrunk = {k: (min(v, SHRINK[k]) if k in SHRINK and isinstance(v, int) else v) for k, v in config.items()}
    shallow = {**shrunk, "num_hidden_layers": min(4, shrunk.get("num_hidden_layers", 4))}
    small = {**SMALL, "model_type": family}
    # mlx-lm's own config as it stands only where it is already small (a few of its tests build full-size args).
    candidates = [shallow, shrunk, small] + ([config] if config.get("hidden_size", 0) <= 256 else [])
    candidates = [{k: v for k, v in {**c, **overrides}.items() if v != DROP} for c in candidates]
    return [c for i, c in enumerate(candidates) if c not in candidates[:i]]


def from_config(config: dict, seed: int = 0, scale: float = 3.0) -> nn.Module:
    """A float32 random model for `config` that has run one forward (so a config that cannot run raises here)."""
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    if num_params(model) > MAX_PARAMS:  # counted on lazy arrays: nothing is allocated yet
        raise ValueError(f"{num_params(model) / 1e6:.0f}M parameters is not tiny")
    model.update(tree_map(lambda p: p * scale if p.ndim == 2 else p, model.parameters()))
    model.set_dtype(mx.float32)
    mx.eval(model(mx.array([[1, 2, 3]]), cache=make_prompt_cache(model)))
    model.config = config
    return model


def build(family: str, seed: int = 0) -> nn.Module:
    """A tiny random model of `family` from the first of its configs that runs; raises what the last one raised."""
    configs = tiny_configs(family)
    for i, config in enumerate(configs):
        try:
            return from_config(config, seed)
        except Exception:
            if i == len(configs) - 1:
                raise
    raise AssertionError("unreachable")


def perturbed(model: nn.Module, noise: float, seed: int = 1) -> nn.Module:
    """The same family and weights, each matrix moved by `noise` times its own spread: a draft that mostly agrees."""
    draft = from_config(model.config, seed=seed)
    mx.random.seed(seed)
    draft.update(
        tree_map(lambda p: p + noise * mx.std(p) * mx.random.normal(p.shape) if p.ndim == 2 else p, model.parameters())
    )
    mx.eval(draft.parameters())
    return draft


def num_params(model: nn.Module) -> int:
    return sum(v.size for _, v in tree_flatten(model.parameters()))


# ---- the sweep: every decoding mode on one family, checked against plain decoding ----

MODES = ("no-draft", "chain", "lookup", "tree", "kv-bits 8")
PROMPT = [1, 2, 3, 4, 5, 6]
NUM_TOKENS = 16
# Relative weight noise of the perturbed draft, tried in turn until its chain both accepts and rejects.
DRAFT_NOISES = (0.03, 0.15, 0.01, 0.06, 0.5, 2.0)
MAX_PARAMS = 30_000_000  # a "tiny" config past this is cut smaller or skipped


@dataclass
class Outcome:
    status: str  # "exact", "refused" (mlxspec says why), "mismatch", "not run" (no tiny config fits the mode)
    detail: str = ""
    drafted: int = 0
    accepted: int = 0


class HintedLookup(PromptLookupDrafter):
    """Prompt lookup whose history starts with the prompt's tail and the target's continuation with one token
    changed: lookup then copies drafts that are accepted up to that token and rejected at it. Drafters never change
    the output, so a drafter seeing more than the target is still exact."""

    def __init__(self, continuation: list[int]):
        super().__init__()
        self.hint = list(continuation)
        self.hint[4] = (self.hint[4] + 1) % VOCAB

    def prefill(self, history) -> None:
        self.reference = list(history[-3:]) + self.hint + [VOCAB - 1] * 3  # searched as if before the history
        super().prefill(history)


def quantizable_variant(family: str) -> nn.Module:
    """The family with 32-wide attention heads, the smallest KV head MLX quantizes."""
    saved = OVERRIDES.get(family)
    config = tiny_configs(family)[0]
    heads = config.get("num_attention_heads", 4)
    wide = {"head_dim": 32, "hidden_size": 32 * heads, "v_head_dim": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16}
    OVERRIDES[family] = {**(saved or {}), **wide}
    try:
        return build(family)
    finally:
        OVERRIDES.pop(family)
        if saved is not None:
            OVERRIDES[family] = saved


def run_engine(target, drafter, prompt, kv_bits=None, num_draft=3, tree_topk=1) -> tuple[list[int], int, int]:
    """(tokens, drafted, accepted) from mlxspec's engine, greedy, through the verify kernel as the API runs it."""
    from mlxspec.decoding.assembly import build_engine
    from mlxspec.kernels import verify as verify_kernel
    from mlxspec.options import DecodeOptions

    options = DecodeOptions(num_draft=num_draft, kv_bits=kv_bits, tree_topk=tree_topk)
    engine = build_engine(verify_kernel.routed_view(target, verify_kernel.resolve("auto")[0]), drafter, options)
    out, drafted, accepted = [], 0, 0
    engine.prefill(list(prompt))
    while len(out) < NUM_TOKENS:
        step = engine.step(NUM_TOKENS - len(out))
        out, drafted, accepted = out + step.tokens, drafted + step.drafted, accepted + step.accepted
    return out, drafted, accepted


def run_mode(family: str, mode: str, target: nn.Module, draft: nn.Module, noise: float = 0.03) -> Outcome:
    from helpers import greedy_logit_gap, mlx_lm_greedy

    from mlxspec.decoding.sampling import SamplingConfig
    from mlxspec.decoding.tree_attention import tree_refusal
    from mlxspec.drafting.draft_model.drafter import DraftModelDrafter
    from mlxspec.errors import UserError

    prompt, kv_bits, tree_topk, drafter = PROMPT, None, 1, None
    try:
        if mode == "chain":
            drafter = DraftModelDrafter(draft, SamplingConfig(), 3)
        elif mode == "lookup":
            drafter = HintedLookup(mlx_lm_greedy(target, PROMPT, NUM_TOKENS))
        elif mode == "tree":
            why = tree_refusal(target)  # what mlxspec's API checks before drafting a tree
            if why is not None:
                return Outcome("refused", f"{why}; drafts a chain instead")
            tree_topk = 2
            drafter = DraftModelDrafter(draft, SamplingConfig(), 3, tree_topk=2)
        elif mode == "kv-bits 8":
            try:
                target = quantizable_variant(family)
            except Exception as error:  # noqa: BLE001
                return Outcome("not run", f"no tiny config with 32-wide heads: {type(error).__name__}")
            draft = perturbed(target, noise)
            drafter, kv_bits = DraftModelDrafter(draft, SamplingConfig(), 3, kv_bits=8), 8
        expected = (
            run_engine(target, None, prompt, kv_bits=8)[0] if kv_bits else mlx_lm_greedy(target, prompt, NUM_TOKENS)
        )
        got, drafted, accepted = run_engine(target, drafter, prompt, kv_bits=kv_bits, tree_topk=tree_topk)
    except UserError as error:
        return Outcome("refused", str(error))
    except Exception as error:  # noqa: BLE001 - a traceback mlxspec let through: the sweep reports it as a failure
        return Outcome("error", f"{type(error).__name__}: {str(error)[:100]}")
    if got != expected:
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), len(expected))
        gap = greedy_logit_gap(target, list(prompt) + expected, len(prompt) + first)
        if gap >= 1e-4:  # a divergence at a near-tie of the reference itself is not a mismatch
            return Outcome("mismatch", f"token {first}: {got[first : first + 3]} vs {expected[first : first + 3]}")
    return Outcome("exact", "", drafted, accepted)


def sweep_family(family: str, modes=MODES) -> dict[str, Outcome]:
    """Every mode on one family; a family no tiny config builds gets one 'not run' outcome per mode."""
    try:
        target = build(family)
        from helpers import mlx_lm_greedy

        mlx_lm_greedy(target, PROMPT, 2)  # mlx-lm's own decoding must run on the tiny config
    except BaseException as error:  # noqa: BLE001 - olmo's import exits; others raise what mlx-lm raises
        reason = f"no tiny config builds: {type(error).__name__}: {str(error)[:80]}"
        return {mode: Outcome("not run", reason) for mode in modes}
    # A draft noisy enough that some drafts are rejected and quiet enough that some are accepted: the chain (and
    # the quantized-KV chain) try DRAFT_NOISES in turn; the tree drafts with the noise the chain settled on.
    chosen, results = DRAFT_NOISES[0], {}
    for mode in modes:
        noises = DRAFT_NOISES if mode in ("chain", "kv-bits 8") else (chosen,)
        tried = []
        for noise in noises:
            outcome = run_mode(family, mode, target, perturbed(target, noise), noise)
            tried.append((outcome, noise))
            if outcome.status != "exact" or 0 < outcome.accepted < outcome.drafted:
                break
        else:  # no noise both accepts and rejects: keep the first that accepts at all
            outcome, noise = ([t for t in tried if t[0].accepted > 0] or tried)[0]
        chosen = noise if mode == "chain" else chosen
        results[mode] = outcome
    return results


def sweep_in_subprocess(family: str, modes=MODES, timeout: int = 180) -> dict[str, Outcome]:
    """sweep_family in a fresh process: a family that crashes MLX (phi3small's tiny config corrupts the heap in
    mlx-lm 0.32 / MLX 0.32) is reported as such instead of taking the caller down."""
    import subprocess
    import sys

    code = (
        "import json; from dataclasses import asdict; from family_sweep import sweep_family; "
        f"print('RESULT' + json.dumps({{m: asdict(o) for m, o in sweep_family({family!r}, {tuple(modes)!r}).items()}}))"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        proc = subprocess.CompletedProcess([], -1, "", f"ran past {timeout} s")
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT"):
            return {mode: Outcome(**fields) for mode, fields in json.loads(line[len("RESULT") :]).items()}
    reason = f"the sweep process died (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"
    return {mode: Outcome("not run", reason) for mode in modes}
