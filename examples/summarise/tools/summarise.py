"""Summarise each file in /inputs with an OpenAI-compatible chat-completions API.

Standard library only. The API key in OPENAI_API_KEY is a placeholder: the run's
credential proxy writes the real key in on the way to the API host. Results go to
/staged/summaries.json (the run's outbox), one entry per input.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

INPUTS = Path("/inputs")
OUT = Path("/staged/summaries.json")
MAX_BYTES = 32 << 10


def summarise(text: str) -> str:
    base = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1").rstrip("/")
    body = {
        "model": os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
        "messages": [
            {"role": "system", "content": os.environ.get("ORCHESTRATOR_INSTRUCTIONS", "")},
            {"role": "user", "content": text},
        ],
    }
    request = urllib.request.Request(
        base + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        data = json.load(answer)
    return str(data["choices"][0]["message"]["content"])


def main() -> int:
    results = []
    failed = 0
    for path in sorted(INPUTS.rglob("*")) if INPUTS.is_dir() else []:
        if path.is_symlink() or not path.is_file():
            continue
        text = path.read_bytes()[:MAX_BYTES].decode("utf-8", errors="replace")
        try:
            results.append({"input": str(path.relative_to(INPUTS)), "summary": summarise(text)})
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            failed += 1
            results.append({"input": str(path.relative_to(INPUTS)), "error": str(exc)[:300]})
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{len(results) - failed} summarised, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
