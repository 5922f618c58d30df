"""Extract the small model configs mlx-lm's own tests build (tests/test_models.py) into tests/family_configs.json.

They are the family sweep's first choice of tiny config (tests/family_sweep.py): mlx-lm keeps them building as its
families change. Usage: python scripts/extract_family_configs.py PATH/TO/mlx-lm/tests/test_models.py [COMMIT]
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "family_configs.json"


def literal(node: ast.AST):
    # Configs hold literals and simple arithmetic ([1] * 4, 2 ** 10): evaluate with no names at all in scope.
    return eval(compile(ast.Expression(node), "config", "eval"), {"__builtins__": {}}, {})


def extract(source: str) -> dict[str, dict]:
    configs: dict[str, dict] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "test_configs" for t in node.targets):
            for element in node.value.elts:
                config = literal(element)
                configs.setdefault(config["model_type"], config)
        is_args = isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "ModelArgs"
        if is_args and isinstance(node.func.value, ast.Name):
            try:
                config = {k.arg: literal(k.value) for k in node.keywords}
            except Exception:  # noqa: BLE001 - a config built from variables is skipped
                continue
            configs.setdefault(config.get("model_type", node.func.value.id), config)
    return configs


def main() -> None:
    source = Path(sys.argv[1]).read_text()
    configs = extract(source)
    meta = {"source": "ml-explore/mlx-lm tests/test_models.py", "commit": sys.argv[2] if len(sys.argv) > 2 else ""}
    OUT.write_text(json.dumps({"_about": meta, **dict(sorted(configs.items()))}, indent=1) + "\n")
    print(f"{len(configs)} family configs -> {OUT}")


if __name__ == "__main__":
    main()
