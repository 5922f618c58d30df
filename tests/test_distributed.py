"""The target sharded over two ranks on localhost (`mlx.launch --backend ring`), the drafter replicated: greedy
speculative output equals plain decoding, chains and trees, with drafts accepted; every rank emits the same
tokens, sampled runs included; rank 0 alone prints; and without a launcher `--distributed` is refused in one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_greedy_equal, mlx_lm_greedy
from tiny import save_tiny_model_dir

from mlxspec.loading import load_model

LAUNCH = [str(Path(sys.executable).parent / "mlx.launch"), "-n", "2", "--backend", "ring", "--python", sys.executable]
PROMPT = [1, 2, 3, 4, 5]

# Run by each rank: the same generations through the API, one JSON line per rank on stdout.
RANK_SCRIPT = """
import json, sys
import mlxspec

target = sys.argv[1]
spec = mlxspec.load(target, draft=target, distributed="tensor")  # self-draft: a replicated copy of the target
runs = {
    "chain": dict(num_draft=3),
    "tree": dict(num_draft=3, tree_topk=2),
    "plain": dict(use_draft=False),
    "sampled": dict(num_draft=3, temperature=1.0, seed=3),
}
out = {"rank": spec.sharding.rank}
for name, options in runs.items():
    result = spec.generate(%r, max_tokens=16, stop_at_eos=False, **options)
    out[name] = result.tokens
    out[name + "_accepted"] = [result.stats.accepted, result.stats.drafted]
print(json.dumps(out), flush=True)
""" % (PROMPT,)


def launch(script: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([*LAUNCH, str(script), *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_two_ranks_decode_exactly_and_every_rank_emits_the_same_tokens(family, tmp_path):
    target_dir = save_tiny_model_dir(tmp_path / family, family)
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    run = launch(script, str(target_dir))
    assert run.returncode == 0, run.stderr[-2000:]
    ranks = sorted(
        (json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")), key=lambda r: r["rank"]
    )
    assert [r["rank"] for r in ranks] == [0, 1]
    assert {k: v for k, v in ranks[0].items() if k != "rank"} == {k: v for k, v in ranks[1].items() if k != "rank"}
    result = ranks[0]
    # Speculative output equals plain decoding on the same two ranks, token for token, chains and trees alike.
    assert result["chain"] == result["tree"] == result["plain"]
    model = load_model(target_dir).model
    assert_greedy_equal(model, PROMPT, result["plain"], mlx_lm_greedy(model, PROMPT, 16))
    # The replicated drafter really drafts: nearly all of a self-draft chain is accepted; a top-2 caterpillar tree
    # is half chain, half alternatives, and one path of it can be accepted.
    for mode, share in (("chain", 1.0), ("tree", 0.5)):
        accepted, drafted = result[mode + "_accepted"]
        assert accepted > 0.8 * share * drafted > 0, (mode, accepted, drafted)


def test_the_command_line_prints_on_rank_zero_only(tmp_path, tiny_dirs):
    launcher = tmp_path / "launch.py"
    launcher.write_text("import sys\nfrom mlxspec.cli import main\nmain(['mlxspec', *sys.argv[1:]])\n")
    target = str(tiny_dirs["target"])
    common = ["generate", "cab", "--model", target, "--temp", "0", "--max-tokens", "12", "--json"]
    run = launch(launcher, *common, "--draft", target, "-k", "3", "--distributed", "tensor")
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
