"""The prompts the suites send: prose and structured requests, and long filler of a given size.

Prose is free text (a story, a description); structured is JSON and code, which drafts predict
better, so the two rates differ on an engine with drafts, as in the recipe's tables. Long prompts
are seeded filler with a fresh tag in front, so no earlier run's prompt cache can serve them;
their size in tokens comes from the endpoint itself (``/tokenize`` where it has one, else the
``usage`` of a one-token probe), not from a guess at the tokenizer.
"""

from __future__ import annotations

import random
import uuid

import httpx

__all__ = ["KINDS", "filler", "messages", "tokens_per_word"]

_PROSE = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Describe a walk through a rainforest at dawn, sound by sound.",
    "Tell the history of a small mountain town over three generations.",
    "Write a letter from a sailor to his sister about his first winter at sea.",
    "Describe a busy night market to someone who has never seen one.",
    "Write a fable about a fox, a crow and a broken bridge.",
    "Tell the story of a clockmaker who builds a clock that runs backwards.",
    "Describe the first day of spring in a city after a long, hard winter.",
]
_STRUCTURED = [
    "Return a JSON array of 12 objects for fictional employees, each with id, name, city, role and salary.",
    "Write a Python function that parses ISO 8601 dates without libraries, with type hints and doctests.",
    "Return a JSON object describing a library: 6 books, each with title, author, year, isbn and tags.",
    "Write a SQL schema for an online shop (customers, orders, order items, products) with indexes.",
    "Write a TypeScript interface and a validator function for a user profile with nested address.",
    "Return a JSON list of 10 cities with name, country, latitude, longitude and population.",
    "Write a Python class implementing an LRU cache with get, put and a size limit, with tests.",
    "Return a YAML document describing a CI pipeline with build, test and deploy stages.",
]
KINDS = {"prose": _PROSE, "structured": _STRUCTURED}

_WORDS = (
    "amber",
    "basalt",
    "cinder",
    "delta",
    "ember",
    "fjord",
    "granite",
    "harbor",
    "iris",
    "jade",
    "kelp",
    "lumen",
    "marsh",
    "nectar",
    "onyx",
    "pebble",
    "quartz",
    "river",
    "sable",
    "tundra",
    "umber",
    "vale",
    "willow",
    "xenon",
    "yarrow",
    "zephyr",
    "anchor",
    "beacon",
    "canyon",
    "dune",
    "estuary",
    "forest",
    "glacier",
    "heath",
    "island",
    "jungle",
    "knoll",
    "lagoon",
    "meadow",
)


def messages(kind: str, index: int) -> list[dict[str, str]]:
    """The ``index``-th prompt of ``kind`` (``prose`` or ``structured``), cycling."""
    prompts = KINDS[kind]
    return [{"role": "user", "content": prompts[index % len(prompts)]}]


def filler(words: int, seed: int) -> str:
    """``words`` seeded filler words behind a fresh tag (never seen by a prompt cache before)."""
    rng = random.Random(seed)
    body = " ".join(rng.choice(_WORDS) for _ in range(words))
    return f"[{uuid.uuid4().hex}] {body}"


async def tokens_per_word(client: httpx.AsyncClient, model: str) -> float:
    """How many tokens one filler word costs on this endpoint's tokenizer."""
    sample = filler(2_000, seed=1)
    try:
        reply = await client.post("/tokenize", json={"model": model, "prompt": sample})
        if reply.status_code == 200 and reply.json().get("count"):
            return float(reply.json()["count"]) / 2_000
    except (httpx.HTTPError, ValueError):
        pass
    counts = []
    for words in (10, 2_010):  # the difference cancels the chat template's own tokens
        body = {
            "model": model,
            "messages": [{"role": "user", "content": filler(words, seed=2)}],
            "max_tokens": 1,
            "temperature": 0,
        }
        reply = (await client.post("/v1/chat/completions", json=body)).raise_for_status()
        counts.append(int(reply.json()["usage"]["prompt_tokens"]))
    if counts[1] - counts[0] < 100:  # the endpoint reports no real prompt size: assume a word a token
        return 1.0
    return (counts[1] - counts[0]) / 2_000
