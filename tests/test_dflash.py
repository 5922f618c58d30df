"""DFlash block drafters: z-lab's checkpoints load as published (both config layouts), the target taps stay aligned
with the kept positions, greedy output equals plain decoding (chains and DDTrees, kernel on and off, llama, qwen3
and a qwen3_5 hybrid), trained drafts are really accepted, sampled output follows the target's law, and a drafter
made for another target is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
import pytest
from helpers import assert_greedy_equal, assert_one_line, mlx_lm_greedy, speculative_tokens
from stats import ALPHA, chi_square_pvalue
from test_engine_exactness import exact_joint
from tiny import make_tiny, save_tiny_model_dir
from tiny_dflash import save_zlab_dflash

from mlxspec import UserError
from mlxspec.decoding.sampling import SamplingConfig
from mlxspec.decoding.target_features import decoder_layers, forward_with_hidden
from mlxspec.drafting.dflash.drafter import DFlashDrafter, best_first_tree
from mlxspec.drafting.dflash.files import load_dflash, parse_dflash_config
from mlxspec.loading import LoadedModel, load_model
from mlxspec.train.dflash import block_loss, cache_features

FAMILIES = ("llama", "qwen3", "qwen3_5")
PROMPT = [1, 2, 3, 1, 2, 3, 4]


def tiny_target(family: str, seed: int = 1):
    return make_tiny(family, seed=seed, num_hidden_layers=4)


def loaded(model) -> LoadedModel:
    return LoadedModel(model, None, model.config, Path("/nonexistent/tiny"))


def zlab_drafter(target, tmp_path, layout="old", block=8, seed=0):
    return load_dflash(save_zlab_dflash(tmp_path / f"dflash-{layout}", target, layout, block, seed), loaded(target))


def test_taps_are_the_tapped_layers_outputs_and_leave_the_model_unchanged():
    target = tiny_target("llama")
    tokens = mx.array([PROMPT])
    before = target(tokens)
    features, logits = forward_with_hidden(target, tokens, None, (0, 3))
    h = target.model.embed_tokens(tokens)
    outputs = []
    for layer in target.model.layers:  # the layers by hand (no cache: a causal mask is needed)
        h = layer(h, mask="causal", cache=None)
        outputs.append(h)
    assert mx.allclose(features, mx.concatenate([outputs[0], outputs[3]], axis=-1), atol=1e-5).item()
    assert mx.array_equal(logits, before).item() and mx.array_equal(target(tokens), before).item()
    assert type(target.model.layers[0]).__name__ == "TransformerBlock"  # the class keeps its name and parameters
    assert "self_attn.q_proj.weight" in dict(_flat(target.model.layers[0].parameters()))


def _flat(tree):
    from mlx.utils import tree_flatten

    return tree_flatten(tree)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layout", ["old", "new"])
def test_greedy_equals_plain_decoding_chains_and_ddtrees(family, layout, tmp_path):
    target = tiny_target(family)
    model = zlab_drafter(target, tmp_path, layout)
    want = mlx_lm_greedy(target, PROMPT, 24)
    trees = (1,) if family == "qwen3_5" else (1, 2, 3)  # recurrent targets verify chains (the API drafts those)
    for kernel in ("auto", "off"):
        for topk in trees:
            drafter = DFlashDrafter(model, target, SamplingConfig(), tree_topk=topk, max_nodes=9)
            got = speculative_tokens(target, None, PROMPT, 24, 5, drafter=drafter, kernel=kernel, tree_topk=topk)
            assert_greedy_equal(target, PROMPT, got[:24], want)


def trained_drafter(target, tmp_path, steps: int = 400):
    """A tiny drafter trained (block_loss, as train-heads does) on the tiny target's own greedy continuations."""
    model = zlab_drafter(target, tmp_path)
    rng = np.random.default_rng(0)
    # The test prompt's own continuation among them: these tests are about the drafting mechanics, not about how a
    # drafter trained on 24 windows of a random model generalizes.
    prompts = [PROMPT, *rng.integers(0, 8, (23, 4)).tolist()]
    windows = np.array([p + mlx_lm_greedy(target, p, 48 - len(p)) for p in prompts])
    taps = tuple(model.config.target_layer_ids)
    train_taps, final = cache_features(loaded(target), windows, taps, lambda s: None, "test")
    optimizer = optim.Adam(learning_rate=1e-2)
    step = nn.value_and_grad(model, lambda m, *a: block_loss(m, loaded(target), *a, gamma=4.0))
    for _ in range(steps):
        picked = rng.integers(0, len(windows), 8)
        anchors = mx.array(rng.integers(1, windows.shape[1] - 8 + 1, (8, 8)))
        args = (mx.array(windows[picked]), mx.array(train_taps[picked]).astype(mx.float32))
        (_, _), grads = step(model, *args, mx.array(final[picked]).astype(mx.float32), anchors)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state)
    return model


# Every family in the whole suite (20-30 s each on 2 cores).
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_trained_drafts_are_accepted_exact_and_the_drafter_cache_matches_a_fresh_one(family, tmp_path):
    """Drafts really accepted (and rejected: rollback and deferred replay run); after the run the drafter's context
    rows equal those a fresh drafter builds from one forward over the whole history, so taps stayed aligned."""
    target = make_tiny(family, seed=1, logit_scale=2.0)  # two layers: a small drafter can learn to follow it
    model = trained_drafter(target, tmp_path)
    want = mlx_lm_greedy(target, PROMPT, 40)
    trees = (1,) if family == "qwen3_5" else (1, 2)
    for topk in trees:
        totals, engines = {}, []
        drafter = DFlashDrafter(model, target, SamplingConfig(), tree_topk=topk, max_nodes=8)
        got = speculative_tokens(
            target, None, PROMPT, 40, 5, drafter=drafter, tree_topk=topk, totals=totals, engine_out=engines
        )
        assert_greedy_equal(target, PROMPT, got[:40], want)
        # Well above chance (an untrained drafter gets 0-5% of 8 tokens accepted here): the drafts line up
        assert totals["accepted"] > 0.2 * totals["drafted"] / (3 if topk > 1 else 1), totals
        assert totals["accepted"] < totals["drafted"], totals  # some rejected: rollback ran
        engines[0].settle()
        history = engines[0].history
        drafter.block_logits(1)  # feed the rows handed over since the last proposal
        fresh = DFlashDrafter(model, target, SamplingConfig())
        fresh.prefill(history)
        features, _ = forward_with_hidden(target, mx.array([history[:-1]]), None, drafter.target_taps)
        fresh.set_hidden(features[0])
        fresh.block_logits(1)
        assert drafter.fed == fresh.fed == len(history) - 1
        kept, rebuilt = drafter.cache[0].keys[..., : drafter.fed, :], fresh.cache[0].keys[..., : fresh.fed, :]
        assert mx.allclose(kept, rebuilt, atol=1e-4).item()


@pytest.mark.parametrize(
    "sampling, topk",
    [
        pytest.param(SamplingConfig(1.0), 1, id="chain-T1", marks=pytest.mark.slow),
        pytest.param(SamplingConfig(0.7, top_p=0.9), 1, id="chain-T0.7-top-p", marks=pytest.mark.slow),
        pytest.param(SamplingConfig(1.0), 2, id="ddtree-T1", marks=pytest.mark.slow),
        pytest.param(SamplingConfig(0.7, top_p=0.9), 2, id="ddtree-T0.7-top-p", marks=pytest.mark.slow),
    ],
)
def test_sampled_output_follows_the_target_law(sampling, topk, tmp_path):
    """Chi-square of 3000 seeded runs (3 tokens, vocab 8) against the enumerated law; false alarm 1e-3. The chain
    draws row i from q_i and is verified by Leviathan/Chen with those q_i; the DDTree by sampling the target at its
    nodes. Power check: the same counts reject the target's law at another temperature."""
    target = make_tiny("llama", seed=0, logit_scale=3.0, num_hidden_layers=4)
    model = zlab_drafter(target, tmp_path)
    prompt, length = [1, 2, 1], 3
    counts = np.zeros([8] * length)
    totals = {}
    for seed in range(3000):
        drafter = DFlashDrafter(model, target, sampling, tree_topk=topk, max_nodes=5)
        out = speculative_tokens(
            target,
            None,
            prompt,
            length,
            3,
            sampling=sampling,
            seed=seed,
            drafter=drafter,
            tree_topk=topk,
            totals=totals,
        )
        counts[tuple(out)] += 1
    assert totals["accepted"] > 300  # the acceptance rule was really exercised
    assert chi_square_pvalue(counts, exact_joint(target, prompt, sampling, length)) > ALPHA
    other = SamplingConfig(sampling.temperature * 1.3, top_p=sampling.top_p)
    assert chi_square_pvalue(counts, exact_joint(target, prompt, other, length)) < ALPHA


def test_a_sampled_ddtree_leads_with_the_chain_of_coupled_draws(tmp_path):
    """At T>0 each block row's coupled draw (its depth's key) leads the row's candidates: the DDTree's first path is
    the sampled chain the same block and keys give, so the tree keeps whatever the chain would."""
    target = make_tiny("llama", seed=0, logit_scale=3.0, num_hidden_layers=4)
    model = zlab_drafter(target, tmp_path)
    sampling = SamplingConfig(1.0)
    for seed in range(6):
        keys = mx.random.split(mx.random.key(seed), 4)
        proposals = []
        for topk in (1, 3):
            drafter = DFlashDrafter(model, target, sampling, tree_topk=topk, max_nodes=9)
            drafter.prefill(PROMPT)
            proposals.append(drafter.propose(4, keys))
        chain, tree = proposals
        parents, node, spine = tree.shape.parents, 0, []
        # Follow each node's first child: nodes are in BFS order, the spine first at its depth
        for _ in range(chain.tokens.shape[0]):
            node = parents.index(node, node + 1)
            spine.append(tree.tokens[node - 1].item())
        assert spine == chain.tokens.tolist(), seed


def test_best_first_tree_keeps_the_most_probable_paths_with_their_ancestors():
    logps = np.log([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.9, 0.05, 0.05]]).tolist()
    shape, paths = best_first_tree(logps, 5)

    def joint(path):
        return sum(logps[depth][rank] for depth, rank in enumerate(path))

    every = [(a,) for a in range(3)] + [(a, b) for a in range(3) for b in range(3)]
    every += [(a, b, c) for a in range(3) for b in range(3) for c in range(3)]
    best = sorted(every, key=joint, reverse=True)[:5]
    assert set(paths) == set(best)  # here the five best paths are closed under taking parents
    assert all(path[:-1] in paths or len(path) == 1 for path in paths)
    assert shape.parents[0] == -1 and shape.size == 6 and shape.depths[1:] == tuple(len(p) for p in paths)


def test_both_config_layouts_parse_to_the_same_drafter_settings():
    from tiny_dflash import zlab_config

    old = parse_dflash_config(zlab_config(4, 32, 8, [0, 3], "old", block=16, mask=7), "old")
    new = parse_dflash_config(zlab_config(4, 32, 8, [0, 3], "new", block=16, mask=7), "new")
    assert (old.block_size, new.block_size) == (16, 16)
    assert (old.rope_theta, new.rope_theta) == (1e6, 1e7)
    assert old.target_layer_ids == new.target_layer_ids == (0, 3) and old.mask_token_id == new.mask_token_id == 7
    assert old.sliding(0) is None and new.sliding(0) == 6 and new.sliding(1) is None


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c, w: c.update(num_target_layers=6), "expects a target with num_target_layers=6, but"),
        (lambda c, w: c.update(hidden_size=64), "expects a target with hidden_size=64"),
        (lambda c, w: c.update(vocab_size=9), "expects a target with vocab_size=9"),
        (lambda c, w: w.pop("layers.1.mlp.up_proj.weight"), "lacks layers.1.mlp.up_proj.weight"),
        (lambda c, w: w.update({"layers.0.extra.weight": mx.zeros(2)}), "holds layers.0.extra.weight"),
        (lambda c, w: c["dflash_config"].update(target_layer_ids=[0, 9]), "taps target layer 9"),
        (lambda c, w: c.pop("dflash_config"), "has no dflash_config"),
    ],
)
def test_a_drafter_for_another_target_or_incomplete_is_refused_by_name(change, message, tmp_path):
    target = tiny_target("llama")
    path = save_zlab_dflash(tmp_path / "d", target)
    config = json.loads((path / "config.json").read_text())
    weights = dict(mx.load(str(path / "model.safetensors")))
    change(config, weights)
    (path / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        load_dflash(path, loaded(target))


def test_generate_with_dflash_from_the_command_line(cli_run, tmp_path):
    """A z-lab checkpoint directory loads unchanged: --dflash greedy equals --no-draft; bad paths get one line."""
    target_dir = save_tiny_model_dir(tmp_path / "target", "qwen3", seed=1, num_hidden_layers=4)
    drafter_dir = save_zlab_dflash(tmp_path / "dflash", tiny_target("qwen3"), "new")  # (the same config)
    common = ("generate", "abcab", "--model", target_dir, "--max-tokens", "12", "--json")
    code, plain, err = cli_run(*common, "--no-draft")
    assert code == 0, err
    # Each with its k: the default, -k auto, may decode plainly where this machine's timings say drafting cannot pay
    # (test_k_auto_with_dflash_is_exact_and_states_how_it_drafted covers it).
    chain, tree = ("-k", "4"), ("-k", "4", "--tree-topk", "2", "--tree-nodes", "6")
    for extra in (chain, tree, ("-k", "3", "--temp", "0.7", "--seed", "1")):
        code, out, err = cli_run(*common, "--dflash", drafter_dir, *extra)
        assert code == 0, err
        result = json.loads(out)
        assert result["mode"].startswith("dflash") and result["stats"]["drafted"] > 0
        if extra in (chain, tree):
            assert result["tokens"] == json.loads(plain)["tokens"]
    assert_one_line(cli_run(*common, "--dflash", tmp_path / "nowhere"), "is not a DFlash directory")
    bench = ("bench", "--model", target_dir, "--dflash", drafter_dir, "--modes", "plain,dflash", "-k", "2")
    code, _, err = cli_run(
        *bench, "--repeats", "1", "--max-tokens", "4", "--temp", "0", "--profile", "--json", tmp_path / "b.json"
    )
    assert code == 0, err
    results = json.loads((tmp_path / "b.json").read_text())["results"]
    assert set(results["profile dflash 0.0"]) == {"draft", "verify", "target probs", "accept", "bookkeeping", "tokens"}
    rows = {row["mode"] for row in results["0.0"]}
    trees = {f"mlxspec dflash-tree-{nodes}n-beam{topk}" for nodes, topk in ((8, 2), (15, 3), (31, 4))}
    assert {"mlxspec dflash k=2", "mlxspec dflash k=auto", *trees} <= rows
    assert_one_line(cli_run(*common, "--dflash", drafter_dir, "--draft", target_dir), "are two drafters")


def test_a_family_without_a_layer_list_is_refused_by_name():
    model = nn.Module()
    model.model = nn.Module()  # no `layers`
    with pytest.raises(UserError, match="keeps no list of decoder layers"):
        decoder_layers(model)


def test_a_widened_drafter_on_the_widened_target_keeps_its_function(tmp_path):
    """bench --widen: the drafter widened with the target drafts the same distributions (float rounding aside)."""
    from mlxspec.bench.widen import WidenSpec, widen, widen_dflash

    target = make_tiny("llama", seed=1, num_hidden_layers=2)
    spec = WidenSpec(3, 64)
    wide_target, _ = widen(target, target.config, spec)
    model = zlab_drafter(target, tmp_path)
    wide_model = widen_dflash(model, spec, spec.layers)
    history = PROMPT + [5, 6, 1, 0]

    def block(drafter_model, model_of_target):
        drafter = DFlashDrafter(drafter_model, model_of_target, SamplingConfig())
        drafter.prefill(history)
        features, _ = forward_with_hidden(model_of_target, mx.array([history[:-1]]), None, drafter.target_taps)
        drafter.set_hidden(features[0])
        return drafter.block_logits(5)

    assert wide_model.config.hidden_size == 64 and wide_model.config.num_target_layers == 3
    assert mx.allclose(block(model, target), block(wide_model, wide_target), atol=1e-4).item()


def test_the_draft_length_controller_pays_a_block_drafter_once_per_step():
    from mlxspec.decoding.costs import CostCurve, expected_speedup
    from mlxspec.decoding.draft_length import DraftLengthController

    flat = {n: 0.010 for n in range(1, 9)}  # verification as cheap as one token: a bandwidth-bound target
    cheap = CostCurve(flat, 0.0, 256, "test", draft_block=0.002)
    assert expected_speedup(cheap, 0.5, 0) == 1.0  # plain decoding pays no block
    assert expected_speedup(cheap, 1.0, 7) == pytest.approx(8 * 0.010 / (0.002 + 0.010))
    assert DraftLengthController(cheap, 7).can_win
    dear = CostCurve(flat, 0.0, 256, "test", draft_block=0.2)  # a block costs 20 target tokens: never pays
    assert not DraftLengthController(dear, 7).can_win


def test_k_auto_with_dflash_is_exact_and_states_how_it_drafted(tmp_path):
    import mlxspec

    target_dir = save_tiny_model_dir(tmp_path / "target", "qwen3", seed=1, num_hidden_layers=4)
    drafter_dir = save_zlab_dflash(tmp_path / "dflash", tiny_target("qwen3"))
    spec = mlxspec.load(target_dir, dflash=drafter_dir, num_draft="auto")
    result = spec.generate([1, 2, 3, 1, 2], max_tokens=12, stop_at_eos=False)
    plain = spec.generate([1, 2, 3, 1, 2], max_tokens=12, stop_at_eos=False, use_draft=False)
    assert result.tokens == plain.tokens
    # either it drafted (and says k=auto) or the cost curve said drafting cannot pay (and says so)
    assert (
        result.stats.mode == "dflash" and result.stats.num_draft == "auto"
    ) or "drafting to pay" in result.stats.note


def test_k_auto_with_dflash_at_a_temperature_measures_its_block_and_keeps_the_seeded_text(tmp_path):
    """At T>0 the block cost is measured with sampled proposals (one key per depth); the seeded text is plain's."""
    import mlxspec

    target_dir = save_tiny_model_dir(tmp_path / "target", "qwen3", seed=1, num_hidden_layers=4)
    drafter_dir = save_zlab_dflash(tmp_path / "dflash", tiny_target("qwen3"))
    spec = mlxspec.load(target_dir, dflash=drafter_dir, num_draft="auto")
    options = dict(max_tokens=12, stop_at_eos=False, temperature=0.7, seed=5)
    result = spec.generate([1, 2, 3, 1, 2], **options)
    assert result.tokens == spec.generate([1, 2, 3, 1, 2], use_draft=False, **options).tokens


def test_the_prompt_cache_keeps_the_drafter_rows_and_stays_exact(tmp_path):
    """A conversation's second turn reuses the first's caches, the drafter's context rows included."""
    import mlxspec

    target_dir = save_tiny_model_dir(tmp_path / "target", "llama", seed=1, num_hidden_layers=4)
    drafter_dir = save_zlab_dflash(tmp_path / "dflash", tiny_target("llama"))
    cached = mlxspec.load(target_dir, dflash=drafter_dir, num_draft=4, prompt_cache=2)
    fresh = mlxspec.load(target_dir, dflash=drafter_dir, num_draft=4)
    first = [1, 2, 3, 1, 2, 3]
    turn = cached.generate(first, max_tokens=10, stop_at_eos=False)
    second = first + turn.tokens + [4, 5, 6]
    again = cached.generate(second, max_tokens=10, stop_at_eos=False)
    assert again.stats.reused_tokens > len(first) and again.stats.prompt_cache == "prefix"
    assert again.tokens == fresh.generate(second, max_tokens=10, stop_at_eos=False).tokens
    assert again.tokens == mlx_lm_greedy(load_model(target_dir).model, second, 10)


# The whole suite (CI) runs it; the quick run keeps one train-heads round trip (test_feature_heads) within 8 minutes.
@pytest.mark.slow
def test_train_heads_dflash_writes_zlab_format_that_loads_resumes_and_refuses_another_base(tiny_dirs, tmp_path):
    from mlxspec.train.dflash import DFlashTrainConfig, train_dflash

    target = load_model(tiny_dirs["target"])
    out = tmp_path / "dflash"
    config = DFlashTrainConfig(steps=3, batch_size=2, anchors=4, seq_len=80, distill_sequences=4, eval_windows=2)
    lines = []
    trained = train_dflash(target, out, config, log=lines.append)
    raw = json.loads((out / "config.json").read_text())
    assert raw["dflash_config"]["target_layer_ids"] == list(trained.config.target_layer_ids)
    assert raw["mlxspec"]["base_model_identity"] and len(raw["mlxspec"]["acceptance_by_row"]) == 7
    assert any(line.startswith("step 3/3 ") and "ETA" in line for line in lines)
    loaded_back = load_dflash(out, target)  # z-lab's reader path, with our fingerprint checked
    want, got = dict(_flat(trained.parameters())), dict(_flat(loaded_back.parameters()))
    assert want.keys() == got.keys() and all(mx.allclose(want[k], got[k], atol=2e-2).item() for k in want)
    with pytest.raises(UserError, match="was trained on base model"):
        load_dflash(out, load_model(tiny_dirs["draft"]))
    again = train_dflash(target, out, config, log=lines.append)  # a finished run resumes without training
    assert all(mx.array_equal(v, dict(_flat(again.parameters()))[k]).item() for k, v in want.items())


def test_a_paused_controller_decodes_plainly_where_no_length_pays_and_keeps_probing():
    from mlxspec.decoding.costs import CostCurve
    from mlxspec.decoding.draft_length import MAX_PROBE_EVERY, PROBE_EVERY, DraftLengthController

    curve = CostCurve({n: 0.010 for n in range(1, 9)}, 0.0, 256, "test", draft_block=0.006)
    controller = DraftLengthController(curve, 7, pause=True)
    assert controller.next_length() > 0  # the prior (alpha 0.6) says drafting pays
    for _ in range(20):
        controller.update(drafted=4, accepted=0)  # nothing accepted: alpha falls
    lengths = [controller.next_length() for _ in range(8 * MAX_PROBE_EVERY)]
    probes = [i + 1 for i, k in enumerate(lengths) if k]
    # plain, with a probe after 8 steps, then 16, 32, 64 and every 64 from then on
    expected, at, gap = [], 0, PROBE_EVERY
    while at + gap <= len(lengths):
        at += gap
        expected.append(at)
        gap = min(2 * gap, MAX_PROBE_EVERY)
    assert probes == expected and set(lengths) == {0, 1}
    for _ in range(20):
        controller.update(drafted=1, accepted=1)  # the probes are accepted: drafting resumes
    assert controller.next_length() > 1
    eager = DraftLengthController(curve, 7)  # without pause: at least one token every step
    for _ in range(20):
        eager.update(drafted=4, accepted=0)
    assert eager.next_length() == 1


def test_where_drafting_steps_are_timed_slower_than_plain_ones_the_controller_pauses():
    """The curve can say drafting pays while the steps say otherwise (per-step overhead the curve leaves out): the
    steps' measured cost over the curve's scales drafting's, with drafting probes (after PROBE_EVERY steps, then
    less often) and plain steps kept measured."""
    from mlxspec.decoding.costs import CostCurve
    from mlxspec.decoding.draft_length import PROBE_EVERY, WARMUP_STEPS, DraftLengthController

    curve = CostCurve({n: 0.010 for n in range(1, 9)}, 0.0, 256, "test")  # flat: every length looks free
    controller = DraftLengthController(curve, 4, pause=True)
    lengths = [controller.next_length() for _ in range(PROBE_EVERY)]
    assert lengths.count(0) == 1 and all(k > 0 for k in lengths[:-1])  # drafting, with one plain step to measure
    for _ in range(WARMUP_STEPS):
        controller.observe(2, 1.0)  # not counted
    for _ in range(5):
        controller.observe(2, 0.030)  # a drafting step: 3x the curve's 10 ms
        controller.observe(0, 0.010)  # a plain one: as the curve says
    assert controller.drafting_scale == pytest.approx(3.0)
    paused = [controller.next_length() for _ in range(3 * PROBE_EVERY)]
    assert [i + 1 for i, k in enumerate(paused) if k] == [PROBE_EVERY, 3 * PROBE_EVERY]  # probes at 8, then 16 on
    for _ in range(10):
        controller.observe(2, 0.010)  # the probes now cost what the curve says
    assert controller.drafting_scale < 1.5 and controller.next_length() > 0


def test_a_paused_controller_lets_plain_steps_queue_their_next_forward_and_stays_exact():
    """While paused, plain_next promises the coming step is plain, so the engine queues its forward as plain
    decoding does (the overlap a paused draft model lacked): output stays equal to plain decoding, the promise is
    kept (no drafting step follows a queued forward), and the probes still draft."""
    from mlxspec.decoding.assembly import build_engine
    from mlxspec.decoding.costs import CostCurve
    from mlxspec.decoding.draft_length import DraftLengthController
    from mlxspec.drafting.factory import make_drafter
    from mlxspec.options import DecodeOptions

    target, draft = make_tiny("llama", seed=0, vocab_size=32), make_tiny("llama", seed=7, vocab_size=32)
    options = DecodeOptions(num_draft="auto").validate()
    curve = CostCurve({n: 0.010 + 0.002 * (n - 1) for n in range(1, 9)}, 0.001, 256, "test")
    controller = DraftLengthController(curve, 4, pause=True)
    assert controller.can_win  # drafting could pay, at high acceptance
    controller.successes, controller.failures = 0.2, 1.8  # alpha 0.1: no length pays
    engine = build_engine(target, make_drafter(options, draft_model=draft), options, controller=controller)
    engine.prefill(PROMPT)
    out, queued, drafted_steps = [], 0, 0
    while len(out) < 40:
        step = engine.step(40 - len(out))
        out += step.tokens
        queued += engine._prefetched is not None
        drafted_steps += step.drafted > 0
    assert out[:40] == mlx_lm_greedy(target, PROMPT, 40)
    assert queued > 20 and drafted_steps > 0  # plain steps queued their successors; probes drafted
