"""The target sharded over two ranks on localhost (`mlx.launch --backend ring`), the drafter replicated: greedy
speculative output equals plain decoding on the same ranks and single-process mlx-lm, chains and trees, tensor and
pipeline parallel, a hybrid (recurrent) target included; drafts are accepted; every rank emits the same tokens,
sampled runs included; sampled output follows the target's law (chi-square); rank 0 alone prints; a rank that dies
stops the other with one line instead of a hang; and without a launcher `--distributed` is refused in one line."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from helpers import assert_greedy_equal, mlx_lm_greedy
from mlx.utils import tree_map
from stats import ALPHA, chi_square_pvalue
from test_engine_exactness import exact_joint
from tiny import make_tiny, save_tiny_model_dir

from mlxspec.decoding.sampling import SamplingConfig
from mlxspec.loading import load_model

LAUNCH = [str(Path(sys.executable).parent / "mlx.launch"), "-n", "2", "--backend", "ring", "--python", sys.executable]
PROMPT = [1, 2, 3, 4, 5]

# Run by each rank: the same generations through the API, one JSON line per rank on stdout.
RANK_SCRIPT = """
import json, sys
import mlxspec

target, draft, mode = sys.argv[1:4]
spec = mlxspec.load(target, draft=draft, distributed=mode)
runs = {
    "chain": dict(num_draft=3),
    "tree": dict(num_draft=3, tree_topk=2),
    "plain": dict(use_draft=False),
    "sampled": dict(num_draft=3, temperature=1.0, seed=3),
    "random_seed": dict(num_draft=3, temperature=1.0, seed=None),
}
out = {"rank": spec.sharding.rank}
for name, options in runs.items():
    result = spec.generate(%r, max_tokens=16, stop_at_eos=False, **options)
    out[name] = result.tokens
    out[name + "_stats"] = [result.stats.accepted, result.stats.drafted, result.stats.mode]
print(json.dumps(out), flush=True)
""" % (PROMPT,)

# (family, mode, draft): the draft is the target itself (a replicated copy, so nearly all of it is accepted) or
# another model (drafts rejected too: on the hybrid target that exercises the recurrent rewind and replay).
CASES = {
    "llama-tensor": ("llama", "tensor", "self"),
    "qwen3-tensor": ("qwen3", "tensor", "self"),
    "qwen2-pipeline": ("qwen2", "pipeline", "self"),
    "qwen3_5-pipeline": ("qwen3_5", "pipeline", "other"),
}


def perturbed_copy(model_dir: Path, path: Path, noise: float = 0.1) -> Path:
    """The same model with every matrix moved by `noise` times its own spread: a draft that mostly agrees."""
    shutil.copytree(model_dir, path)
    weights = mx.load(str(path / "model.safetensors"))
    mx.random.seed(1)
    noisy = {k: w + noise * mx.std(w) * mx.random.normal(w.shape) if w.ndim == 2 else w for k, w in weights.items()}
    mx.save_safetensors(str(path / "model.safetensors"), noisy)
    return path


# Tests that start two ranks (mlx.launch, 5-60 s each here) run in the whole suite, not in the quick default.
TWO_RANKS = pytest.mark.slow
# Wall-clock limits on rank processes guard against hangs only: generous, since a loaded 2-core machine runs two ranks
# many times slower than an idle one (the chi-square run once took over 400 s there).
HANG_LIMIT = 1800


def launch(script: Path, *args: str, timeout: float = HANG_LIMIT) -> subprocess.CompletedProcess:
    """Two ranks on free ports: mlx.launch's fixed default ports would collide between parallel test workers. A port
    can still be taken between the check and the rank's bind (another worker's connection); the ring then fails with
    EADDRINUSE before any rank runs the script, and only then is the launch retried on other ports."""
    for _ in range(PORT_TRIES):
        command = [*LAUNCH, "--starting-port", str(free_port_pair()), str(script), *args]
        run = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if PORT_TAKEN not in run.stderr:
            return run
    return run


PORT_TAKEN = "[ring] Couldn't bind socket (error: 98)"  # errno 98: EADDRINUSE
PORT_TRIES = 5


def free_port_pair() -> int:
    """A port p with p + 1 free too (mlx.launch gives rank r the port p + r), drawn below the kernel's ephemeral range
    so that no outgoing connection (the server tests', the other ranks') is handed it meanwhile."""
    low = ephemeral_port_floor()
    rng = np.random.default_rng()
    while True:
        first = int(rng.integers(max(1024, low // 2), low - 1))
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", first))
                b.bind(("127.0.0.1", first + 1))
                return first
            except OSError:
                continue


def ephemeral_port_floor() -> int:
    """Linux's lowest ephemeral port; elsewhere (macOS) the IANA range's, 49152."""
    ports = Path("/proc/sys/net/ipv4/ip_local_port_range")
    return int(ports.read_text().split()[0]) if ports.exists() else 49152


def json_objects(text: str) -> list[dict]:
    """Every JSON object in the ranks' shared stdout: mlx.launch relays both ranks into one pipe, so one rank's line
    can land on the same line as the other's."""
    decoder, found, at = json.JSONDecoder(), [], text.find("{")
    while at != -1:
        try:
            item, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:  # a brace in other output: not an object
            at = text.find("{", at + 1)
            continue
        if isinstance(item, dict):
            found.append(item)
        at = text.find("{", end)
    return found


def rank_lines(run: subprocess.CompletedProcess) -> list[dict]:
    assert run.returncode == 0, run.stderr[-2000:]
    ranks = sorted(json_objects(run.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1], run.stderr[-2000:]
    return ranks


@TWO_RANKS
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_decode_exactly_and_every_rank_emits_the_same_tokens(case, tmp_path):
    family, mode, draft = CASES[case]
    # Four layers, so each pipeline rank of the hybrid holds a linear-attention and a full-attention layer.
    target_dir = save_tiny_model_dir(tmp_path / family, family, num_hidden_layers=4)
    draft_dir = target_dir if draft == "self" else perturbed_copy(target_dir, tmp_path / "draft")
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    ranks = rank_lines(launch(script, str(target_dir), str(draft_dir), mode))
    assert {k: v for k, v in ranks[0].items() if k != "rank"} == {k: v for k, v in ranks[1].items() if k != "rank"}
    result = ranks[0]
    # Speculative output equals plain decoding on the same two ranks, token for token, chains and trees alike.
    assert result["chain"] == result["tree"] == result["plain"]
    model = load_model(target_dir).model
    assert_greedy_equal(model, PROMPT, result["plain"], mlx_lm_greedy(model, PROMPT, 16))
    hybrid = family == "qwen3_5"
    # Trees run on sharded attention (heads split, or layers split); a hybrid drafts chains (no per-branch state).
    assert ("tree" in result["tree_stats"][2]) != hybrid, result["tree_stats"]
    for name in ("chain", "tree", "sampled"):
        accepted, drafted, _ = result[name + "_stats"]
        if draft == "self":  # a self-draft chain is nearly all accepted; a top-2 tree is half alternatives
            assert accepted > 0.8 * (0.5 if name == "tree" and not hybrid else 1.0) * drafted > 0, (name, result)
        else:  # some drafts accepted, some rejected (the rewind path ran)
            assert 0 < accepted < drafted, (name, result)


# Rank 1's drafter proposes other drafts than rank 0's, as a drafter that rounds differently on another chip would:
# other tokens, one node fewer, no draft at all, or a chain where rank 0 drafts a tree. Every rank must still verify
# rank 0's draft, so the output stays exact and the same on both ranks (chains and trees).
DIVERGING_SCRIPT = """
import json, sys
import mlxspec
from mlxspec.decoding.draft import Draft
from mlxspec.drafting.draft_model.drafter import DraftModelDrafter

target, mode = sys.argv[1:3]
spec = mlxspec.load(target, draft=target, distributed=mode)
if spec.sharding.rank == 1:
    propose, calls = DraftModelDrafter.propose, []
    def other_drafts(self, *args, **kwargs):
        draft, calls[:] = propose(self, *args, **kwargs), calls + [1]
        if draft is None or len(calls) %% 3 == 0:
            return None
        if len(calls) %% 3 == 1:
            return Draft((draft.tokens + 1) %% 8, draft.probs, draft.shape)
        return Draft(draft.tokens[:-1])  # a chain one node shorter
    DraftModelDrafter.propose = other_drafts
out = {"rank": spec.sharding.rank}
for name, options in (("chain", {}), ("tree", {"tree_topk": 2})):
    result = spec.generate(%r, max_tokens=16, stop_at_eos=False, num_draft=3, **options)
    out[name] = [result.tokens, result.stats.accepted, result.stats.mode]
print(json.dumps(out), flush=True)
""" % (PROMPT,)


@TWO_RANKS
@pytest.mark.parametrize("mode", ["tensor", "pipeline"])
def test_every_rank_verifies_rank_zeros_draft_even_when_its_own_drafter_differs(mode, tmp_path):
    target_dir = save_tiny_model_dir(tmp_path / "qwen2", "qwen2")
    script = tmp_path / "diverging.py"
    script.write_text(DIVERGING_SCRIPT)
    ranks = rank_lines(launch(script, str(target_dir), mode))
    model = load_model(target_dir).model
    expected = mlx_lm_greedy(model, PROMPT, 16)
    for name in ("chain", "tree"):
        assert ranks[0][name] == ranks[1][name]
        tokens, accepted, described = ranks[0][name]
        assert_greedy_equal(model, PROMPT, tokens, expected)
        assert accepted > 10 and ("tree" in described) == (name == "tree")  # rank 0's self-draft, accepted


HEADS_SCRIPT = """
import json, sys
import mlxspec

target, eagle, medusa, mode = sys.argv[1:5]
out = {}
for kind, source in (("eagle", eagle), ("medusa", medusa)):
    spec = mlxspec.load(target, **{kind: source}, distributed=mode)
    out["rank"] = spec.sharding.rank
    for name, options in (("chain", dict(num_draft=3)), ("tree", dict(num_draft=3, tree_topk=3))):
        result = spec.generate(%r, max_tokens=16, stop_at_eos=False, **options)
        out[kind + "_" + name] = [result.tokens, result.stats.accepted, result.stats.drafted, result.stats.mode]
print(json.dumps(out), flush=True)
""" % (PROMPT,)


@TWO_RANKS
@pytest.mark.parametrize(("family", "mode"), [("llama", "tensor"), ("qwen2", "pipeline")])
def test_feature_and_medusa_heads_on_every_rank_decode_exactly(family, mode, tmp_path):
    """The heads read the target's final hidden state, whole on every rank after the all-reduce (tensor) or the
    final all-gather (pipeline). On the one-layer tensor target the EAGLE head copies the target's own layer, so
    its drafts must be accepted; the two-layer pipeline target gets random heads (exactness only)."""
    from mlxspec.drafting.heads.feature_head import new_eagle_head, save_head
    from mlxspec.drafting.heads.files import base_model_identity
    from mlxspec.drafting.heads.medusa import MedusaConfig, MedusaHeads, save_medusa

    layers = 1 if mode == "tensor" else 2
    target_dir = save_tiny_model_dir(tmp_path / family, family, num_hidden_layers=layers)
    target = load_model(target_dir)
    head = new_eagle_head(target.config, target.path)
    mx.random.seed(0)
    head.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, head.parameters()))
    dims = target.config["hidden_size"]
    if layers == 1:  # copy the target's layer; fc passes the token embedding through
        head.block.update(target.model.layers[0].parameters())
        head.fc.weight = mx.concatenate([mx.eye(dims), mx.zeros((dims, dims))], axis=1)
        head.fc.bias = mx.zeros((dims,))
    save_head(head, tmp_path / "eagle")
    identity = base_model_identity(target_dir)
    medusa = MedusaHeads(MedusaConfig(3, dims, target.config["vocab_size"], base_model_identity=identity))
    save_medusa(medusa, tmp_path / "medusa")
    script = tmp_path / "heads.py"
    script.write_text(HEADS_SCRIPT)
    ranks = rank_lines(launch(script, str(target_dir), str(tmp_path / "eagle"), str(tmp_path / "medusa"), mode))
    assert {k: v for k, v in ranks[0].items() if k != "rank"} == {k: v for k, v in ranks[1].items() if k != "rank"}
    expected = mlx_lm_greedy(target.model, PROMPT, 16)
    runs = {name: run for name, run in ranks[0].items() if name != "rank"}
    for name, (tokens, accepted, drafted, described) in runs.items():
        assert_greedy_equal(target.model, PROMPT, tokens, expected)
        assert drafted > 0 and ("tree" in described) == name.endswith("tree"), (name, described)
        if layers == 1 and name.startswith("eagle"):
            assert accepted > 0.5 * min(drafted, 16), (name, accepted, drafted)


CHI_SCRIPT = """
import json, sys
import mlxspec

target, draft, mode, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
spec = mlxspec.load(target, draft=draft, distributed=mode)
samples, accepted = [], 0
for seed in range(runs):
    result = spec.generate([1, 2], max_tokens=3, stop_at_eos=False, num_draft=2, temperature=1.0, seed=seed)
    samples.append(result.tokens)
    accepted += result.stats.accepted
print(json.dumps({"rank": spec.sharding.rank, "samples": samples, "accepted": accepted}), flush=True)
"""


@TWO_RANKS
def test_sampled_output_on_two_ranks_follows_the_target_distribution(tmp_path):
    """Chi-square of 500 seeded 2-rank runs (tensor parallel, K=2, 3 tokens: accept, residual and bonus paths)
    against the enumerated law of the target; false alarm 1e-3. The same counts must reject the draft's own law
    (power check). 500 runs, not the single-process test's 4000: a ring step costs ~40 ms on two shared cores."""
    target = save_tiny_model_dir(tmp_path / "target", "llama", seed=0, logit_scale=3.0)
    draft = save_tiny_model_dir(tmp_path / "draft", "llama", seed=5, logit_scale=3.0)
    script = tmp_path / "chi.py"
    script.write_text(CHI_SCRIPT)
    ranks = rank_lines(launch(script, str(target), str(draft), "tensor", "500"))
    assert ranks[0]["samples"] == ranks[1]["samples"]
    counts = np.zeros([8] * 3)
    for tokens in ranks[0]["samples"]:
        counts[tuple(tokens)] += 1
    assert ranks[0]["accepted"] > 100  # the acceptance rule was really exercised
    sampling = SamplingConfig(1.0)
    law = exact_joint(make_tiny("llama", seed=0, logit_scale=3.0), [1, 2], sampling, 3)
    assert chi_square_pvalue(counts, law) > ALPHA
    assert (
        chi_square_pvalue(counts, exact_joint(make_tiny("llama", seed=5, logit_scale=3.0), [1, 2], sampling, 3)) < ALPHA
    )


def cli_launcher(tmp_path: Path) -> Path:
    launcher = tmp_path / "launch.py"
    launcher.write_text("import sys\nfrom mlxspec.cli.main import main\nmain(['mlxspec', *sys.argv[1:]])\n")
    return launcher


@TWO_RANKS
def test_the_command_line_prints_on_rank_zero_only(tmp_path, tiny_dirs):
    target = str(tiny_dirs["target"])
    common = ["generate", "cab", "--model", target, "--temp", "0", "--max-tokens", "12", "--json"]
    run = launch(cli_launcher(tmp_path), *common, "--draft", target, "-k", "3", "--distributed", "tensor")
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # rank 1 printed nothing
    sharded = json.loads(lines[0])
    single = subprocess.run(
        [sys.executable, "-m", "mlxspec", *common, "--no-draft"], capture_output=True, text=True, check=True
    )
    model = load_model(tiny_dirs["target"]).model
    prompt = [2, 0, 1]  # "cab" in the char tokenizer
    assert_greedy_equal(model, prompt, sharded["tokens"], json.loads(single.stdout)["tokens"])
    assert sharded["stats"]["accepted"] > 0


# Rank 1 dies at its second step, as a crashed or unplugged machine would; rank 0 runs the plain command line.
DYING_SCRIPT = """
import os, sys
if os.environ["MLX_RANK"] == "1":
    from mlxspec.decoding import engine
    step = engine.SpeculativeEngine.step_phases  # (the step the Speculator runs, as forward requests)
    def dying(self, *args, **kwargs):
        if self.target_calls == 1:
            os._exit(3)
        return (yield from step(self, *args, **kwargs))
    engine.SpeculativeEngine.step_phases = dying
from mlxspec.cli.main import main
main(["mlxspec", *sys.argv[1:]])
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@TWO_RANKS
@pytest.mark.parametrize("mode", ["tensor", "pipeline"])
def test_a_rank_that_dies_stops_the_other_with_one_line_not_a_hang(mode, tmp_path):
    """The ranks are started by hand (mlx.launch would kill the survivor itself), so what is tested is mlxspec's
    own exit: status 1 and one mlxspec line after MLX's own ring messages, well inside the timeout."""
    target = str(save_tiny_model_dir(tmp_path / "qwen2", "qwen2"))
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"], [f"127.0.0.1:{free_port()}"]]))
    script = tmp_path / "dying.py"
    script.write_text(DYING_SCRIPT)
    command = [sys.executable, str(script), "generate", "abcabc", "--model", target, "--draft", target, "-k", "2"]
    command += ["--max-tokens", "200", "--temp", "0", "--distributed", mode]
    ranks = [
        subprocess.Popen(
            command,
            env={**os.environ, "MLX_HOSTFILE": str(hostfile), "MLX_RANK": str(rank), "MLXSPEC_NO_OPENBLAS": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        survivor_err = ranks[0].communicate(timeout=HANG_LIMIT)[1]  # a hang is the failure this guards
        ranks[1].communicate(timeout=HANG_LIMIT)
    finally:
        for rank in ranks:
            rank.kill()
    assert ranks[1].returncode == 3
    assert ranks[0].returncode == 1, survivor_err[-2000:]
    last = survivor_err.strip().splitlines()[-1]
    assert last.startswith("mlxspec: error: another distributed rank stopped ("), survivor_err[-2000:]
    assert "Traceback" not in survivor_err


def test_distributed_without_a_launcher_is_refused_in_one_line(tiny_dirs):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxspec",
            "generate",
            "ab",
            "--model",
            str(tiny_dirs["target"]),
            "--distributed",
            "tensor",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("mlxspec: error: --distributed tensor runs on several ranks; start them with")
    assert len(run.stderr.strip().splitlines()) == 1


@TWO_RANKS
@pytest.mark.parametrize(
    ("family", "mode", "message"),
    [
        ("llama", "pipeline", "mlx-lm has no pipeline split for llama; use --distributed tensor"),
        ("qwen3_5", "pipeline", "splitting qwen3_5's 2 layers over 2 ranks leaves recurrent layers on some ranks only"),
    ],
)
def test_a_split_that_cannot_work_is_refused_in_one_line(family, mode, message, tmp_path):
    """Every rank reaches the same verdict; mlx.launch stops the others once the first exits (status 2)."""
    target = str(save_tiny_model_dir(tmp_path / family, family))
    run = launch(cli_launcher(tmp_path), "generate", "ab", "--model", target, "--distributed", mode)
    errors = [line for line in run.stderr.splitlines() if line.startswith("mlxspec: error:")]
    assert errors and all(message in line for line in errors), run.stderr[-2000:]
    assert "exited with code 2" in run.stderr and "Traceback" not in run.stderr


def test_a_draft_survives_its_encoding_for_the_other_ranks():
    """encode_draft / decode_draft, the layout every step's all-reduce carries (pure; no ranks needed)."""
    from mlxspec.decoding.draft import Draft
    from mlxspec.decoding.trees import TreeShape
    from mlxspec.distributed import decode_draft, encode_draft
    from mlxspec.errors import UserError

    assert encode_draft(None, 3).tolist() == [0, 0, 0, -1, -1, -1, 0, 0, 0]
    assert decode_draft(encode_draft(None, 3).tolist(), None, 1) is None
    chain = Draft(mx.array([5, 6], dtype=mx.int32))
    assert encode_draft(chain, 3).tolist() == [2, 0, 0, 0, 1, -1, 5, 6, 0]
    back = decode_draft(encode_draft(chain, 3).tolist(), None, 1)
    assert back.tokens.tolist() == [5, 6] and back.shape is None and back.probs is None
    tree = Draft(mx.array([5, 6, 7], dtype=mx.int32), None, TreeShape((-1, 0, 0, 1)))
    assert encode_draft(tree, 4).tolist() == [3, 1, 0, 0, 0, 1, -1, 5, 6, 7, 0]
    back = decode_draft(encode_draft(tree, 4).tolist(), chain, 1)
    assert back.tokens.tolist() == [5, 6, 7] and back.shape == tree.shape
    sampled = Draft(mx.array([5, 6], dtype=mx.int32), mx.ones((2, 8)) / 8)
    back = decode_draft(encode_draft(sampled, 3).tolist(), sampled, 0)
    assert back.probs is sampled.probs  # this rank's own distributions travel with rank 0's tokens
    with pytest.raises(UserError, match="rank 1 drafted other tokens than rank 0"):
        decode_draft(encode_draft(sampled, 3).tolist(), chain, 1)  # nothing here to accept rank 0's chain with


DFLASH_SCRIPT = """
import json, sys
import mlxspec

target, dflash = sys.argv[1:3]
spec = mlxspec.load(target, dflash=dflash, distributed="tensor")
out = {"rank": spec.sharding.rank}
for name, options in (("chain", dict(num_draft=4)), ("ddtree", dict(num_draft=4, tree_topk=2, tree_nodes=6))):
    result = spec.generate(%r, max_tokens=16, stop_at_eos=False, **options)
    out[name] = [result.tokens, result.stats.drafted, result.stats.mode]
print(json.dumps(out), flush=True)
""" % (PROMPT,)


@TWO_RANKS
def test_a_dflash_drafter_reads_the_taps_of_a_tensor_sharded_target(tmp_path):
    """Each rank taps its sharded layers, whose outputs are whole after the all-reduce: chains and DDTrees decode
    exactly and alike on both ranks."""
    from tiny_dflash import save_zlab_dflash

    target_dir = save_tiny_model_dir(tmp_path / "llama", "llama", num_hidden_layers=4)
    dflash_dir = save_zlab_dflash(tmp_path / "dflash", make_tiny("llama", num_hidden_layers=4))
    script = tmp_path / "dflash_ranks.py"
    script.write_text(DFLASH_SCRIPT)
    ranks = rank_lines(launch(script, str(target_dir), str(dflash_dir)))
    assert {k: v for k, v in ranks[0].items() if k != "rank"} == {k: v for k, v in ranks[1].items() if k != "rank"}
    model = load_model(target_dir).model
    for name in ("chain", "ddtree"):
        tokens, drafted, mode = ranks[0][name]
        assert_greedy_equal(model, PROMPT, tokens, mlx_lm_greedy(model, PROMPT, 16))
        assert drafted > 0 and mode.startswith("dflash") and ("tree" in mode) == (name == "ddtree")


def test_dflash_refuses_a_pipeline_split_by_name(tmp_path):
    import mlxspec
    from mlxspec import UserError

    with pytest.raises(UserError, match="--dflash taps layers that a pipeline split spreads over ranks"):
        mlxspec.load(tmp_path, dflash=tmp_path, distributed="pipeline")
