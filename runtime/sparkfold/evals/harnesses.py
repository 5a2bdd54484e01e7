"""The connected-pair harnesses ``sparkfold eval`` can drive: lm-eval (GSM8K) and EvalPlus
(HumanEval+ and MBPP+), run as their own command lines against the endpoint's OpenAI API.

Both fetch their data sets at run time (Hugging Face Hub, GitHub releases), so they work only
where the endpoint's host can reach those; neither is a dependency. What each is given, and why:

- lm-eval: model ``local-chat-completions`` on ``/v1/chat/completions``, the chat template
  applied by the server (``--apply_chat_template``), greedy, ``max_gen_toks`` from ``--max-tokens``
  so GLM's thinking cannot eat the answer, ``reasoning_effort=none`` when thinking is off (lm-eval
  spreads ``--gen_kwargs`` into the request body; sparkfold reads ``none`` as thinking off). It
  scores ``content`` only, as it should.
- EvalPlus: ``--backend openai --base-url …/v1 --greedy`` and ``--max_new_tokens`` from
  ``--max-tokens`` (its default of 768 leaves a thinking model's content empty).

Flags are lm-eval 0.4's and EvalPlus 0.3's documented ones; this module only builds and runs the
command lines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

__all__ = ["Harness", "command_for"]


@dataclass(frozen=True)
class Harness:
    suite: str
    executable: str
    install: str
    argv: list[str]
    env: dict[str, str]

    def available(self) -> bool:
        return shutil.which(self.executable) is not None

    def run(self) -> int:
        return subprocess.run(self.argv, env={**os.environ, **self.env}, check=False).returncode


def command_for(
    suite: str,
    url: str,
    model: str,
    *,
    api_key: str | None,
    limit: int | None,
    max_tokens: int,
    thinking: bool,
    concurrency: int,
    out_dir: str,
) -> Harness:
    base = url.rstrip("/")
    key = {"OPENAI_API_KEY": api_key or "unused"}
    if suite == "gsm8k":
        gen = f"max_gen_toks={max_tokens},temperature=0,do_sample=False" + (
            "" if thinking else ",reasoning_effort=none"
        )
        argv = [
            "lm_eval",
            "--model",
            "local-chat-completions",
            "--model_args",
            f"model={model},base_url={base}/v1/chat/completions,num_concurrent={concurrency},"
            "max_retries=3,tokenized_requests=False",
            "--tasks",
            "gsm8k",
            "--apply_chat_template",
            "--fewshot_as_multiturn",
            "--gen_kwargs",
            gen,
            "--output_path",
            out_dir,
            *(["--limit", str(limit)] if limit else []),
        ]
        return Harness(suite, "lm_eval", "pip install 'lm-eval[api]'", argv, key)
    if suite in ("humaneval+", "mbpp+"):
        argv = [
            "evalplus.evaluate",
            "--model",
            model,
            "--dataset",
            suite.rstrip("+"),
            "--backend",
            "openai",
            "--base-url",
            f"{base}/v1",
            "--greedy",
            "--max_new_tokens",
            str(max_tokens),
            "--root",
            out_dir,
        ]
        return Harness(suite, "evalplus.evaluate", "pip install evalplus", argv, key)
    raise ValueError(f"no harness for {suite}")
