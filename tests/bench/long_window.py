"""The long window end to end on a GPU: ~1,048,576-token chat requests through the gateway.

Starts ``sparkfold engine`` (kind exllamav3, the window ``--context``, four lanes, the pool sized
by the engine: at most four windows, KV cache ``--cache``) and ``sparkfold api`` in front of it,
both as child processes on one config with every other setting at its default (body limits,
timeouts, prefill chunks and recurrent checkpoints), then, through the gateway, as streamed
``/v1/chat/completions`` (thinking off, 8 reply tokens):

1. ``resend``: a ``--resend`` (64k) prompt sent twice; client TTFT of both, their ratio, the reused
   tokens, and a third visit straight to the engine server for its stats block: where the second
   visit's time goes (``prepare_s`` rendering and tokenizing; exllamav3's ``queued``: matching
   pages, restoring recurrent state; ``prefill``: the one step left);
2. ``lengths``: one new prompt at each of ``--lengths`` (8k … the window): client TTFT, prefill
   tok/s (prompt tokens / TTFT), peak RSS (``VmHWM``) of the gateway and the engine processes;
3. the same re-send at ``--resend-long`` (256k);
4. ``four``: four new window-sized prompts at once (only where the pool holds four).

Every step is skipped, saying so, when its projected time (from the last measured prefill rate)
does not fit what is left of ``--budget-s``; a refused request records its status and message
(the limit it met). The JSON is rewritten after every request, so a run cut short keeps what it
measured.

    python tests/bench/long_window.py MODEL_DIR OUT.json [--budget-s 420] [--cache fp16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.gpu.gpu_engine import child_env, text_of
from tests.integration.engine_procs import ChildProcess, EngineProcess, free_port, wait_healthy, write_config

from sparkfold.bench.client import open_client, stream_chat

WINDOW = 1_048_576
LENGTHS = (8_192, 32_768, 65_536, 131_072, 262_144, 524_288, WINDOW)
REPLY_TOKENS = 8
MARGIN = 512
"""Tokens below the window a window-sized prompt keeps (the chat template's and the reply's)."""


class Run:
    """The results, rewritten to ``path`` after every change; the clock of ``budget_s``."""

    def __init__(self, path: Path, budget_s: float) -> None:
        self.path = path
        self.deadline = time.monotonic() + budget_s
        self.data: dict[str, Any] = {"lengths": [], "skipped": [], "refused": []}
        self.rate = 0.0
        """The last measured prefill rate (tok/s), for projections."""

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def fits(self, name: str, tokens: int) -> bool:
        """Whether ``tokens`` of prefill fit the time left (twice the last rate's projection: longer
        prompts attend to more); records the skip otherwise."""
        projected = 2 * tokens / self.rate if self.rate else 0.0
        if projected < self.left_s():
            return True
        self.note("skipped", f"{name}: projected {projected:.0f} s, {self.left_s():.0f} s left")
        return False

    def note(self, key: str, value: Any) -> None:
        if isinstance(self.data.get(key), list):
            self.data[key].append(value)
        else:
            self.data[key] = value
        self.path.write_text(json.dumps(self.data, indent=2) + "\n")
        print(f"{key}: {json.dumps(value)}", flush=True)


def peak_rss_mib(pid: int) -> dict[str, float]:
    """Peak resident memory (``VmHWM``) of ``pid`` and each process under it, in MiB."""
    out = {}
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    for proc in procs:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                out[f"{proc.pid}:{proc.name()}"] = round(int(line.split()[1]) / 1024, 1)
    return out


async def ask(client: httpx.AsyncClient, text: str) -> dict[str, Any]:
    """One streamed chat request (``sparkfold bench``'s client): client TTFT, prompt and cached
    tokens; or the refusal."""
    body = {"model": "glm", "messages": [{"role": "user", "content": text}], "max_tokens": REPLY_TOKENS}
    reply = await stream_chat(client, body | {"temperature": 0})
    if not reply.ok or not reply.ttft_s:
        return {"ok": False, "error": (reply.error or "no reply")[:500], "wall_s": round(reply.wall_s, 2)}
    prompt = reply.prompt_tokens or 0
    return {
        "ok": True,
        "prompt_tokens": prompt,
        "cached_tokens": reply.cached_tokens or 0,
        "ttft_s": round(reply.ttft_s, 4),
        "wall_s": round(reply.wall_s, 4),
        "prefill_tok_s": round(prompt / reply.ttft_s),
    }


@contextmanager
def stack(
    model: Path, out: Path, context: int, cache: str
) -> Iterator[tuple[str, str, ChildProcess, EngineProcess]]:
    """The engine server and the gateway on one config, defaults elsewhere; their URLs and processes."""
    engine_port, api_port = free_port(), free_port()
    config = write_config(
        out / "long.toml",
        model,
        kind="exllamav3",
        port=engine_port,
        served_name="glm",
        context=context,
        max_tokens=64,
        parallel=4,
        thinking=False,
    )
    extra = f'[engine.exllamav3]\ncache = "{cache}"\n[api]\nhost = "127.0.0.1"\nport = {api_port}\n'
    config.write_text(config.read_text() + extra)
    engine = EngineProcess(config, out / "long-engine.log", env=child_env())
    api = ChildProcess(
        [sys.executable, "-c", "from sparkfold.cli import main; main()", "api", "--config", str(config)],
        out / "long-api.log",
        env=child_env(),
    )
    engine_url, api_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{api_port}"
    try:
        wait_healthy(engine_url, engine, deadline_s=400)
        wait_healthy(api_url, api, deadline_s=60)
        yield engine_url, api_url, api, engine
    finally:
        api.stop()
        engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("json", type=Path)
    parser.add_argument("--budget-s", type=float, default=420, help="stop starting steps past this")
    parser.add_argument("--context", type=int, default=WINDOW)
    parser.add_argument("--cache", default="fp16", choices=["fp16", "q8", "q6", "q4"])
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--resend", type=int, default=65_536)
    parser.add_argument("--resend-long", type=int, default=262_144)
    parser.add_argument("--four", type=int, default=4, help="window-sized prompts at once (0: none)")
    args = parser.parse_args()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    run = Run(args.json, args.budget_s)
    from transformers import AutoTokenizer

    cap = args.context - MARGIN
    lengths = [min(int(n), cap) for n in args.lengths.split(",") if n]
    texts = Texts(AutoTokenizer.from_pretrained(str(args.model)), max(lengths))
    with stack(args.model, args.json.parent, args.context, args.cache) as (engine_url, api_url, api, engine):
        pool = httpx.get(f"{engine_url}/health", timeout=10).json().get("pool", {})
        run.note("setup", {"context": args.context, "cache": args.cache, "pool": pool})
        asyncio.run(_steps(run, texts, engine_url, api_url, lengths, args, pool))
        run.note(
            "peak_rss_mib", {"gateway": peak_rss_mib(api.proc.pid), "engine": peak_rss_mib(engine.proc.pid)}
        )


class Texts:
    """Prompts of a given length cut from one long text (tokenized once: a window of text takes
    seconds), each behind its own tag, so no two share a cached page."""

    def __init__(self, tokenizer: Any, longest: int) -> None:
        self.tokenizer = tokenizer
        self.ids = tokenizer.encode(text_of(tokenizer, longest, 0), add_special_tokens=False)

    def get(self, tokens: int, tag: str) -> str:
        return f"{tag}: " + str(self.tokenizer.decode(self.ids[: max(tokens - 8, 1)]))


async def _steps(
    run: Run, texts: Texts, engine_url: str, api_url: str, lengths: list[int], args: Any, pool: dict[str, Any]
) -> None:
    async with open_client(api_url, None, timeout_s=max(run.left_s(), 10), streams=8) as client:
        await _send(run, client, "warm-up", texts.get(256, "warm-up"))
        await _resend(run, client, engine_url, texts.get(min(args.resend, lengths[-1]), "resend"), "resend")
        for n, tokens in enumerate(lengths):
            if not run.fits(f"length {tokens}", tokens):
                break
            result = await _send(run, client, f"length {tokens}", texts.get(tokens, f"length-{n}"))
            run.note("lengths", {"target": tokens, **result})
        long = min(args.resend_long, lengths[-1])
        if run.fits("resend-long", 2 * long):
            await _resend(run, client, engine_url, texts.get(long, "resend-long"), "resend_long")
        window = lengths[-1]
        lanes = int(pool.get("pool_tokens", 0)) // (window + MARGIN)
        count = min(args.four, lanes)
        if args.four and count < args.four:
            run.note("skipped", f"{args.four} at once: the pool holds {lanes} windows ({pool})")
        if count > 1 and run.fits(f"{count} at once", count * window):
            prompts = [texts.get(window, f"together-{i}") for i in range(count)]
            started = time.perf_counter()
            results = await asyncio.gather(
                *(_send(run, client, f"together {i}", t) for i, t in enumerate(prompts))
            )
            wall = time.perf_counter() - started
            total = sum(r.get("prompt_tokens", 0) for r in results)
            run.note(
                "together",
                {
                    "count": count,
                    "wall_s": round(wall, 2),
                    "prefill_tok_s": round(total / wall),
                    "requests": results,
                },
            )


async def _send(run: Run, client: httpx.AsyncClient, name: str, text: str) -> dict[str, Any]:
    result = await ask(client, text)
    if not result["ok"]:
        run.note("refused", {"request": name, **result})
    else:
        run.rate = result["prefill_tok_s"]
    return result


async def _resend(run: Run, client: httpx.AsyncClient, engine_url: str, text: str, key: str) -> None:
    """``text`` twice through the gateway, then once straight to the engine (its stats block)."""
    first = await _send(run, client, f"{key} first", text)
    second = await _send(run, client, f"{key} second", text)
    body = {
        "model": "glm",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": REPLY_TOKENS,
        "temperature": 0,
    }
    async with httpx.AsyncClient(timeout=max(run.left_s(), 10)) as direct:
        started = time.perf_counter()
        reply = (await direct.post(f"{engine_url}/v1/chat/completions", json=body)).json()
        direct_wall = time.perf_counter() - started
    ratio = first["ttft_s"] / second["ttft_s"] if first.get("ttft_s") and second.get("ttft_s") else 0.0
    run.note(
        key,
        {
            "first": first,
            "second": second,
            "ratio": round(ratio, 1),
            "third_direct": {
                "wall_s": round(direct_wall, 4),
                "stats": reply.get("tensorfold"),
                "usage": reply.get("usage"),
            },
        },
    )


if __name__ == "__main__":
    main()
