"""`mlxspec bench serve`: load, time to first token and decoding speed of `mlxspec serve`, against `mlx_lm.server`.

Each server runs as its own process (bench/serve_client.py); every request goes through the OpenAI-style HTTP API as
a client sends it. Prompts are the openings of held-out stdlib files. What it measures:

- load: N clients x R requests at once; each greedy answer must equal the same prompt's answer asked alone;
- ttft: second turns of conversations, the prefix in the server's prompt cache against the same request made cold;
- compare: mlxspec against mlx_lm.server with the same draft: TTFT and streamed tok/s at T=0 and T=0.7, and whether
  their greedy texts agree;
- batch: 1/2/4/8 clients against mlxspec --max-batch 8, --max-batch 1 and mlx_lm.server's batched plain decoding,
  all up at once and taking turns at each load (the machine's drift falls on all alike); then one client alone,
  alternating single requests between the two mlxspec servers.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from mlxspec.bench.serve_client import Server, timed_stream
from mlxspec.bench.steps import Steps, heldout_files, machine

WHATS = ("load", "ttft", "compare", "batch")


@dataclass
class ServeBenchConfig:
    what: str = "load"
    model: str | None = None
    draft: str | None = None
    num_draft: int | None = None
    clients: int = 8
    loads: tuple[int, ...] = (1, 2, 4, 8)
    requests: int = 10
    max_tokens: int = 64
    rounds: int = 6
    logs: Path = field(default_factory=lambda: Path("."))


def prompts(count: int, lines: int = 12) -> list[str]:
    """The first `lines` lines of held-out stdlib files, as completion prompts."""
    openings = ("".join(file[:lines]) for file in heldout_files())
    return list(islice((text for text in openings if 200 < len(text) < 1200), count))


def percentiles(values: list[float]) -> dict:
    ordered = sorted(values) or [0.0]
    picked = {q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.9, 0.99)}
    return {"p50": round(picked[0.5], 4), "p90": round(picked[0.9], 4), "p99": round(picked[0.99], 4), "n": len(values)}


def client_loop(server: Server, texts: list[str], reference: list[str], first: int, config, results, errors) -> None:
    for r in range(config.requests):
        i = (first + r) % len(texts)
        try:
            got = timed_stream(server, "text", texts[i], config.max_tokens, temperature=0)
            results.append({**got, "exact": got["text"] == reference[i]})
        except Exception as error:  # a load check counts errors rather than stopping at the first
            errors.append(f"{type(error).__name__}: {error}")


def load_check(server: Server, clients: int, config: ServeBenchConfig) -> dict:
    texts = prompts(clients * config.requests // 2 or 1)
    reference = [timed_stream(server, "text", p, config.max_tokens, temperature=0)["text"] for p in texts]
    results: list[dict] = []
    errors: list[str] = []
    start = time.perf_counter()
    jobs = [(server, texts, reference, c * config.requests, config, results, errors) for c in range(clients)]
    threads = [threading.Thread(target=client_loop, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    tokens = sum(r.get("completion_tokens") or 0 for r in results)
    return {
        "clients": clients,
        "requests_per_client": config.requests,
        "completed": len(results),
        "errors": errors,
        "exact": sum(r["exact"] for r in results),
        "latency_s": percentiles([r["latency"] for r in results]),
        "ttft_s": percentiles([r["ttft"] for r in results]),
        "wall_s": round(wall, 2),
        "throughput_tok_s": round(tokens / wall, 1),
    }


def ttft_reuse(server: Server, rounds: int, first_tokens: int) -> dict:
    """Second turns: TTFT with the conversation's prefix cached, and the same request made cold by a unique first
    line (no cache holds its prefix, whatever it keeps)."""
    warm, cold, sizes = [], [], []
    for text in prompts(rounds):
        turn1 = [{"role": "user", "content": text}]
        answer = timed_stream(server, "chat", turn1, first_tokens, temperature=0)["text"]
        turn2 = turn1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "\n\ndef main():\n"}]
        reused = timed_stream(server, "chat", turn2, 8, temperature=0)
        unique = [{"role": "user", "content": f"# {time.time_ns()}\n{text}"}] + turn2[1:]
        fresh = timed_stream(server, "chat", unique, 8, temperature=0)
        warm.append(reused["ttft"])
        cold.append(fresh["ttft"])
        sizes.append((reused.get("prompt_tokens"), reused.get("cached_tokens"), fresh.get("cached_tokens")))
    return {"ttft_reused_s": percentiles(warm), "ttft_cold_s": percentiles(cold), "prompt_cached_reused_cold": sizes}


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
    median = round(statistics.median(rates), 1) if rates else 0.0
    return {"temperature": temperature, "tok_s_median": median, "ttft_s": percentiles(ttfts), "texts": texts}


def one_client_alternating(servers: list[Server], rounds: int, max_tokens: int) -> dict:
    """Each prompt sent to each server in turn, the order flipped every round: tokens over seconds each."""
    tokens, seconds = [0, 0], [0.0, 0.0]
    for r, text in enumerate(prompts(rounds)):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            got = timed_stream(servers[i], "text", text, max_tokens, temperature=0)
            tokens[i] += got.get("completion_tokens") or 0
            seconds[i] += got["latency"]
    rates = [round(t / s, 1) if s else 0.0 for t, s in zip(tokens, seconds)]
    return {"tok_s": rates, "ratio": round(rates[0] / rates[1], 3) if rates[1] else None, "rounds": rounds}


def batch_table(config: ServeBenchConfig, echo) -> dict:
    specs = [
        ("mlxspec --max-batch 8", "mlxspec", config.draft, ["--max-batch", "8"]),
        ("mlxspec --max-batch 1", "mlxspec", config.draft, ["--max-batch", "1"]),
        ("mlx_lm.server (batched, no draft)", "mlx_lm", None, []),
    ]
    servers: list[tuple[str, Server]] = []
    steps = Steps(len(config.loads) * len(specs) + 1, "bench serve batch")
    try:
        for name, kind, draft, extra in specs:
            log = config.logs / f"bench_serve_{kind}_{len(servers)}.log"
            servers.append((name, Server(kind, config.model, draft, config.num_draft, extra, log)))
        rows = []
        for clients in config.loads:
            for name, server in servers:
                load = load_check(server, clients, config)
                rows.append({"server": name, "command": server.command_line, **load})
                echo(
                    f"{name:36s} clients={clients} {load['throughput_tok_s']:6.1f} tok/s  ttft p50 "
                    f"{load['ttft_s']['p50']:.2f} p90 {load['ttft_s']['p90']:.2f}  latency p50 "
                    f"{load['latency_s']['p50']:.2f}  exact {load['exact']}/{load['completed']} "
                    f"errors {len(load['errors'])}"
                )
                steps.done(f"{name}, {clients} clients")
        alone = one_client_alternating([server for _, server in servers[:2]], config.rounds, config.max_tokens)
        steps.done("one client, alternating")
        echo(f"one client, alternating: --max-batch 8 / --max-batch 1 = {alone['ratio']}")
        return {"loads": rows, "one_client_alternating": alone}
    finally:
        for _, server in servers:
            server.stop()


def run_serve_bench(config: ServeBenchConfig, echo=print) -> dict:
    """The report of one `bench serve` run (also printed through `echo` as it goes)."""
    report: dict = {"what": config.what, "machine": machine()}
    if config.what == "batch":
        report["batch"] = batch_table(config, echo)
        return report
    kinds = ["mlxspec", "mlx_lm"] if config.what == "compare" else ["mlxspec"]
    steps = Steps(len(kinds), f"bench serve {config.what}")
    for kind in kinds:
        from mlxspec.loading import DEFAULT_DRAFT

        draft = config.draft or (str(DEFAULT_DRAFT) if kind == "mlx_lm" and config.model is None else None)
        server = Server(kind, config.model, draft, config.num_draft, [], config.logs / f"bench_serve_{kind}.log")
        try:
            entry: dict = {"command": server.command_line}
            if config.what == "load":
                entry["load"] = load_check(server, config.clients, config)
            if config.what in ("ttft", "compare"):
                entry["ttft"] = ttft_reuse(server, config.rounds, config.max_tokens)
            if config.what == "compare":
                entry["decode"] = [decode_speed(server, config.rounds, 128, t) for t in (0.0, 0.7)]
            report[kind] = entry
        finally:
            server.stop()
        steps.done(kind)
        echo(summary(kind, entry))
    if config.what == "compare":  # greedy is deterministic: both servers should write the same text
        pairs = zip(report["mlxspec"]["decode"][0]["texts"], report["mlx_lm"]["decode"][0]["texts"])
        report["greedy_texts_equal"] = [a == b for a, b in pairs]
    return report


def summary(kind: str, entry: dict) -> str:
    lines = [f"## {kind}: {entry['command']}"]
    if "load" in entry:
        load = entry["load"]
        lines.append(
            f"load: {load['completed']} done, {len(load['errors'])} errors, exact {load['exact']}, "
            f"{load['throughput_tok_s']} tok/s, ttft p50 {load['ttft_s']['p50']} s, "
            f"latency p50 {load['latency_s']['p50']} s"
        )
    if "ttft" in entry:
        ttft = entry["ttft"]
        lines.append(f"ttft p50: reused prefix {ttft['ttft_reused_s']['p50']} s, cold {ttft['ttft_cold_s']['p50']} s")
    for decode in entry.get("decode", []):
        lines.append(f"decode T={decode['temperature']}: {decode['tok_s_median']} tok/s median")
    return "\n".join(lines)
