"""Mutation testing of the verification math: every small change to acceptance.py and trees.py that the fast
exactness tests do not catch is printed as a survivor.

    python scripts/mutate_math.py [--jobs 2] [--only acceptance.py]     # about 15 minutes on 2 cores

Each mutant (one operator, comparison, constant or boolean changed) is written into a copy of the package and the
fast tests run against it with a timeout (a mutant that makes decoding loop forever counts as caught). The same
idea as mutmut, whose version 3 trampolines do not survive `mx.compile` here (every compiled mutant timed out).
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("decoding/acceptance.py", "decoding/trees.py")
TESTS = [
    "tests/test_acceptance.py",
    "tests/test_trees.py",
    "tests/test_drafts_accepted.py",
    "tests/test_medusa.py::test_sparse_tree_picks_the_most_probable_paths_parents_first",
    "-k",
    "not follow_the_target and not medusa_drafts and not embedded and not lookup_drafts and not corpus_fallback",
]
SWAPS = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd, ast.And: ast.Or, ast.Or: ast.And,
}  # fmt: skip


def mutation_sites(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """(node, kind) for every place one mutation applies, outside docstrings."""
    sites = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.BoolOp)) and type(node.op) in SWAPS:
            sites.append((node, "op"))
        elif isinstance(node, ast.Compare) and type(node.ops[0]) in SWAPS:
            sites.append((node, "compare"))
        elif (
            isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
        ):
            sites.append((node, "number"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            sites.append((node, "bool"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Invert, ast.Not, ast.USub)):
            sites.append((node, "unary"))
    return sites


def mutate(source: str, index: int) -> tuple[str, int, str] | None:
    """The source with mutation `index` applied, its line and a description; None past the last one."""
    tree = ast.parse(source)
    sites = mutation_sites(tree)
    if index >= len(sites):
        return None
    node, kind = sites[index]
    before = ast.unparse(node)
    if kind == "op":
        node.op = SWAPS[type(node.op)]()
    elif kind == "compare":
        node.ops[0] = SWAPS[type(node.ops[0])]()
    elif kind == "number":
        node.value = node.value + 1
    elif kind == "bool":
        node.value = not node.value
    elif kind == "unary":  # drop the operator: ~x -> x, not x -> x, -x -> x
        replacement = node.operand
        for parent in ast.walk(tree):
            for field, value in ast.iter_fields(parent):
                if value is node:
                    setattr(parent, field, replacement)
                elif isinstance(value, list) and node in value:
                    value[value.index(node)] = replacement
    return (
        ast.unparse(tree),
        node.lineno,
        f"{before} -> {ast.unparse(node) if kind != 'unary' else ast.unparse(node.operand)}",
    )


def run_mutant(file: str, index: int, workdir: Path, timeout: int) -> tuple[str, int, int, str, str]:
    source = (ROOT / "mlxspec" / file).read_text()
    mutated = mutate(source, index)
    assert mutated is not None
    text, line, what = mutated
    copy = workdir / f"{file}-{index}"
    shutil.copytree(ROOT / "mlxspec", copy / "mlxspec", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "mlxspec" / file).write_text(text)
    shutil.copytree(ROOT / "tests", copy / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    (copy / "models").symlink_to(ROOT / "models")
    # Run from the copy: `python -m` puts the working directory first on sys.path, ahead of any install.
    env = dict(os.environ, PYTHONPATH=str(copy), MLXSPEC_NO_OPENBLAS="1")
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *TESTS]
    try:
        proc = subprocess.run(command, cwd=copy, env=env, capture_output=True, timeout=timeout)
        verdict = "survived" if proc.returncode == 0 else "killed"
    except subprocess.TimeoutExpired:
        verdict = "killed (timeout)"
    shutil.rmtree(copy, ignore_errors=True)
    return file, index, line, what, verdict


def check_the_copy_is_what_runs(workdir: Path) -> None:
    """A mutant that breaks import must be caught: otherwise the tests are not running the copy."""
    copy = workdir / "sentinel"
    shutil.copytree(ROOT / "mlxspec", copy / "mlxspec", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "mlxspec" / "decoding" / "acceptance.py").write_text(
        "raise ImportError('the mutated copy is the one imported')\n"
    )
    shutil.copytree(ROOT / "tests", copy / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    env = dict(os.environ, PYTHONPATH=str(copy), MLXSPEC_NO_OPENBLAS="1")
    proc = subprocess.run(
        [sys.executable, "-c", "import mlxspec.decoding.acceptance"], cwd=copy, env=env, capture_output=True, text=True
    )
    assert "the mutated copy is the one imported" in proc.stderr, "the tests would not run the mutated copy"
    shutil.rmtree(copy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", choices=FILES)
    parser.add_argument("--timeout", type=int, default=180)
    args = parser.parse_args()
    jobs = []
    for file in [args.only] if args.only else FILES:
        count = len(mutation_sites(ast.parse((ROOT / "mlxspec" / file).read_text())))
        jobs += [(file, i) for i in range(count)]
    print(f"{len(jobs)} mutants of {', '.join(FILES)}; tests: {' '.join(TESTS)}", flush=True)
    survivors = 0
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        check_the_copy_is_what_runs(Path(tmp))
        futures = [pool.submit(run_mutant, f, i, Path(tmp), args.timeout) for f, i in jobs]
        for future in futures:
            file, index, line, what, verdict = future.result()
            survivors += verdict == "survived"
            print(f"{verdict:16s} {file}:{line}  {what}", flush=True)
    print(f"{len(jobs) - survivors} of {len(jobs)} killed, {survivors} survived")


if __name__ == "__main__":
    main()
