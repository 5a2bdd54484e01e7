"""After the engine says ready, nothing a request does compiles: the start paid it all.

The engine points Triton's, torch inductor's and exllamav3's GEMM autotuner's caches into its cache
directory (``sparkfold.engines.compile_cache``); on a first start they are empty, so whatever the
start compiled lands there. Requests of every shape the engine serves (one short reply, a burst of
``parallel``, a prompt of several prefill chunks, a picture) must add nothing: a file that appears
or grows there after ready is a kernel compiled, or a GEMM tuned, inside a request.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from gpu_engine import Results, start_engine, text_of
from test_exllamav3_engine import ASK, picture
from transformers import AutoTokenizer


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def test_no_request_compiles_after_the_engine_said_ready(
    tmp_path: Path, exl3_model: Path, results: Results
) -> None:
    state = tmp_path / "state"
    url, proc = start_engine(tmp_path, exl3_model, "warm", parallel=4, chunk_tokens=1024, cache_dir=state)
    caches = state / "compile-cache"
    try:
        ready = _files(caches)
        assert ready, f"the start compiled nothing into {caches}: the caches are not the engine's"
        assert "(first start)" in proc.output(), proc.output()[-2000:]
        tokenizer = AutoTokenizer.from_pretrained(str(exl3_model))

        def ask(content: object, max_tokens: int = 16) -> None:
            body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
            reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
            assert reply.status_code == 200, reply.text

        ask("Name three rivers.")
        with ThreadPoolExecutor(4) as pool:  # a batch of every lane, decoding together
            list(pool.map(lambda i: ask(f"Count to {i + 5}.", 32), range(4)))
        ask(text_of(tokenizer, 5_000, seed=41), 4)  # several chunks of prefill
        with ThreadPoolExecutor(2) as pool:  # a long prompt read while another reply decodes
            list(
                pool.map(lambda args: ask(*args), [("Tell a story.", 48), (text_of(tokenizer, 3_000, 42), 4)])
            )
        ask([ASK, picture("noise")])
        after = _files(caches)
        new = sorted(name for name, size in after.items() if ready.get(name) != size)
        results.record("compiled_after_ready", new)
        assert not new, f"compiled after the engine said ready: {new}"
    finally:
        proc.stop()
