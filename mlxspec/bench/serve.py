"""Load check and timings for `mlxspec serve`, and the same measurements against `mlx_lm.server`, through the
official openai client. Each server runs as its own process on a free localhost port, with OpenBLAS preloaded for
both where Debian's is installed (mlxspec re-executes itself with it anyway).

  python scripts/serve_bench.py load --clients 8 --requests 10     # all complete, each greedy output equal to its
                                                                   # sequential run, latency and TTFT percentiles
  python scripts/serve_bench.py ttft                               # second-turn TTFT: reused prefix vs cold
  python scripts/serve_bench.py compare --model M --draft D -k 3   # mlxspec serve vs mlx_lm.server, same draft
  python scripts/serve_bench.py batch --requests 4                 # 1/2/4/8 clients: mlxspec --max-batch 8 vs
                                                                   # --max-batch 1 vs mlx_lm.server (no draft)

Prompts are the openings of held-out stdlib files (models/heldout_files.txt). Writes one JSON object to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.request
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[1]
OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process; `kind` is "mlxspec" or "mlx_lm"."""

    def __init__(self, kind: str, model: str | None, draft: str | None, k: int | None, extra: list[str], log: Path):
        self.port = free_port()
        if kind == "mlxspec":
            command = [sys.executable, "-m", "mlxspec", "serve", "--port", str(self.port), "-v"]
            command += (["--model", model] if model else []) + (["--draft", draft] if draft else [])
            command += (["-k", str(k)] if k else []) + extra
        else:
            command = [
                sys.executable,
                "-m",
                "mlx_lm.server",
                "--port",
                str(self.port),
                "--model",
                model or "models/target",
            ]
            command += (["--draft-model", draft, "--num-draft-tokens", str(k or 3)] if draft else []) + extra
        env = dict(os.environ)
        if Path(OPENBLAS).exists() and sys.platform == "linux":
            env.update(LD_PRELOAD=OPENBLAS, OPENBLAS_THREAD_TIMEOUT="4")
        self.log = open(log, "w")
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=600)
        self.command = " ".join(command)
        self.model_name = "default_model" if kind == "mlx_lm" else "default"  # mlx_lm.server loads any other name
        self._wait()

    def _wait(self, seconds: float = 300) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.command} exited; see {self.log.name}")
            try:
                urllib.request.urlopen(f"{self.url}/v1/models", timeout=2).read()
                return
            except OSError:
                time.sleep(0.3)
        raise SystemExit(f"{self.command} did not come up")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self.log.close()


def prompts(count: int, lines: int = 12) -> list[str]:
    """The first `lines` lines of held-out stdlib files, as completion prompts."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for name in (ROOT / "models" / "heldout_files.txt").read_text().split():
        path = stdlib / name
        if path.exists():
            text = "".join(path.read_text(errors="replace").splitlines(keepends=True)[:lines])
            if 200 < len(text) < 1200:
                out.append(text)
        if len(out) == count:
            break
    return out


def timed_stream(server: Server, kind: str, payload, max_tokens: int, **kwargs) -> dict:
    """One streamed request: text, TTFT (first non-empty text), total latency, usage (where the server sends it)."""
    client = server.client
    start = time.perf_counter()
    first, pieces, usage = None, [], None
    if kind == "chat":
        stream = client.chat.completions.create(
            model=server.model_name,
            messages=payload,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
        )
    else:
        stream = client.completions.create(
            model=server.model_name,
            prompt=payload,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
        )
    for event in stream:
        if event.choices:
            text = event.choices[0].delta.content if kind == "chat" else event.choices[0].text
            if text:
                first = first or time.perf_counter()
                pieces.append(text)
        if getattr(event, "usage", None):
            usage = event.usage
    end = time.perf_counter()
    out = {"text": "".join(pieces), "ttft": (first or end) - start, "latency": end - start}
    if usage is not None:
        out["completion_tokens"] = usage.completion_tokens
        details = getattr(usage, "prompt_tokens_details", None)
        out["cached_tokens"] = getattr(details, "cached_tokens", None) if details else None
        out["prompt_tokens"] = usage.prompt_tokens
    return out


def percentiles(values: list[float]) -> dict:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(pick(0.5), 4), "p90": round(pick(0.9), 4), "p99": round(pick(0.99), 4), "n": len(values)}


def load_check(server: Server, clients: int, requests: int, max_tokens: int) -> dict:
    texts = prompts(clients * requests // 2 or 1)
    reference = [timed_stream(server, "text", p, max_tokens, temperature=0)["text"] for p in texts]
    results, errors = [], []

    def client_loop(c: int) -> None:
        for r in range(requests):
            i = (c * requests + r) % len(texts)
            try:
                got = timed_stream(server, "text", texts[i], max_tokens, temperature=0)
                results.append({**got, "exact": got["text"] == reference[i]})
            except Exception as error:  # a load check counts errors rather than stopping at the first
                errors.append(f"{type(error).__name__}: {error}")

    start = time.perf_counter()
    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    tokens = sum(r.get("completion_tokens", 0) for r in results)
    return {
        "clients": clients,
        "requests_per_client": requests,
        "completed": len(results),
        "errors": errors,
        "exact": sum(r["exact"] for r in results),
        "latency_s": percentiles([r["latency"] for r in results]),
        "ttft_s": percentiles([r["ttft"] for r in results]),
        "wall_s": round(wall, 2),
        "throughput_tok_s": round(tokens / wall, 1),
    }


def ttft_reuse(server: Server, rounds: int, first_tokens: int) -> dict:
    """Second turns of conversations: TTFT with the conversation's prefix in the server's cache, and the same
    request made cold by a unique first line (no cache holds its prefix, whatever it keeps)."""
    texts = prompts(rounds)
    warm, cold, sizes = [], [], []
    for i, text in enumerate(texts):
        turn1 = [{"role": "user", "content": text}]
        answer = timed_stream(server, "chat", turn1, first_tokens, temperature=0)["text"]
        turn2 = turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "\n\ndef main():\n"}]
        reused = timed_stream(server, "chat", turn2, 8, temperature=0)
        unique = [{"role": "user", "content": f"# {time.time_ns()}\n{text}"}] + turn2[1:]
        fresh = timed_stream(server, "chat", unique, 8, temperature=0)
        warm.append(reused["ttft"])
        cold.append(fresh["ttft"])
        sizes.append((reused.get("prompt_tokens"), reused.get("cached_tokens"), fresh.get("cached_tokens")))
    return {
        "ttft_reused_s": percentiles(warm),
        "ttft_cold_s": percentiles(cold),
        "prompt_tokens_cached_reused_cold": sizes,
    }


def decode_speed(server: Server, count: int, max_tokens: int, temperature: float) -> dict:
    """Streamed completions: tokens/s after the first token, and TTFT."""
    rates, ttfts, texts = [], [], []
    for text in prompts(count):
        got = timed_stream(server, "text", text, max_tokens, temperature=temperature, seed=1)
        tokens = got.get("completion_tokens") or 0
        if tokens > 1:
            rates.append((tokens - 1) / max(1e-9, got["latency"] - got["ttft"]))
        ttfts.append(got["ttft"])
        texts.append(got["text"])
    median = round(statistics.median(rates), 1)
    return {"temperature": temperature, "tok_s_median": median, "ttft_s": percentiles(ttfts), "texts": texts}


def batch_table(args, logs: Path) -> dict:
    """Aggregate tok/s, TTFT and latency at 1, 2, 4 and 8 clients: mlxspec batching, mlxspec one at a time, and
    mlx_lm.server's batched plain decoding (no draft: it turns batching off for a draft model). All three servers
    stay up and take turns at each load (only one is ever busy), so the machine's drift over the run falls on all
    of them alike; then one client alone, single requests alternating between the two mlxspec servers."""
    specs = [
        ("mlxspec --max-batch 8", "mlxspec", args.draft, ["--max-batch", "8"]),
        ("mlxspec --max-batch 1", "mlxspec", args.draft, ["--max-batch", "1"]),
        ("mlx_lm.server (batched, no draft)", "mlx_lm", None, []),
    ]
    servers = []
    try:
        for name, kind, draft, extra in specs:
            log = logs / f"serve_bench_batch_{kind}_{len(servers)}.log"
            servers.append((name, Server(kind, args.model, draft, args.k, extra, log)))
        rows = []
        for clients in args.loads:
            for name, server in servers:
                load = load_check(server, clients, args.requests, args.max_tokens)
                rows.append({"server": name, "command": server.command, **load})
                print(
                    f"{name:36s} clients={clients} {load['throughput_tok_s']:6.1f} tok/s  ttft p50 "
                    f"{load['ttft_s']['p50']:.2f} p90 {load['ttft_s']['p90']:.2f}  latency p50 "
                    f"{load['latency_s']['p50']:.2f} p90 {load['latency_s']['p90']:.2f}  exact "
                    f"{load['exact']}/{load['completed']} errors {len(load['errors'])}",
                    flush=True,
                )
        alone = one_client_alternating([server for _, server in servers[:2]], args.rounds, args.max_tokens)
        print(f"one client, alternating: --max-batch 8 / --max-batch 1 = {alone['ratio']:.3f}", flush=True)
        return {"loads": rows, "one_client_alternating": alone}
    finally:
        for _, server in servers:
            server.stop()


def one_client_alternating(servers: list[Server], rounds: int, max_tokens: int) -> dict:
    """Each prompt sent to each server in turn, the order flipped every round: tokens over decode seconds each."""
    tokens, seconds = [0, 0], [0.0, 0.0]
    for r, text in enumerate(prompts(rounds)):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            got = timed_stream(servers[i], "text", text, max_tokens, temperature=0)
            tokens[i] += got.get("completion_tokens") or 0
            seconds[i] += got["latency"]
    rates = [round(t / s, 1) for t, s in zip(tokens, seconds)]
    return {"tok_s": rates, "ratio": round(rates[0] / rates[1], 3), "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["load", "ttft", "compare", "batch"])
    parser.add_argument("--model", default=None, help="[default: the embedded target]")
    parser.add_argument("--draft", default=None, help="[default: the embedded draft with the embedded target]")
    parser.add_argument("-k", type=int, default=None, help="draft length [default: mlxspec's auto]")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--loads", type=int, nargs="+", default=[1, 2, 4, 8], help="batch: the client counts")
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    machine = f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores"
    report: dict = {"what": args.what, "machine": machine, "argv": sys.argv[1:]}
    logs = ROOT / "runs"
    logs.mkdir(exist_ok=True)
    if args.what == "batch":
        report["batch"] = batch_table(args, logs)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1) + "\n")
        return
    kinds = ["mlxspec", "mlx_lm"] if args.what == "compare" else ["mlxspec"]
    for kind in kinds:
        draft = args.draft or ("models/draft" if kind == "mlx_lm" and args.model is None else None)
        server = Server(kind, args.model, draft, args.k, [], logs / f"serve_bench_{kind}.log")
        try:
            entry = {"command": server.command}
            if args.what == "load":
                entry["load"] = load_check(server, args.clients, args.requests, args.max_tokens)
            if args.what in ("ttft", "compare"):
                entry["ttft"] = ttft_reuse(server, args.rounds, args.max_tokens)
            if args.what == "compare":
                entry["decode"] = [decode_speed(server, args.rounds, 128, t) for t in (0.0, 0.7)]
            report[kind] = entry
        finally:
            server.stop()
        print(json.dumps({kind: report[kind]}, indent=1), flush=True)
    if args.what == "compare":  # greedy is deterministic: both servers should write the same text
        pairs = zip(report["mlxspec"]["decode"][0]["texts"], report["mlx_lm"]["decode"][0]["texts"])
        report["greedy_texts_equal"] = [a == b for a, b in pairs]
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
