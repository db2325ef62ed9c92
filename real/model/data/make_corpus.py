"""Regenerate ``corpus.txt``: the text the tiny model's BPE tokenizer is trained on.

Why the project ships its own corpus: the live backend must run offline and build its tiny
model from nothing (no hub downloads, no third-party corpora). The tokenizer only needs to
split English prose, Python and the coding environment's action format sensibly, so the
corpus is made of what the project owns: its own Python sources and docstrings, the shipped
coding tasks, and synthetic agent transcripts in the environment's action format.

Deterministic: the same checkout gives the same file. Run from anywhere::

    python real/data/make_corpus.py
"""

from __future__ import annotations

import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SOURCE_DIRS = ("cluster", "policies", "traces", "sim", "rlsched", "real")
MAX_SOURCE_CHARS = 260_000
N_TRANSCRIPTS = 400

_NAMES = ("total", "items", "value", "count", "result", "text", "line", "left", "right",
          "index", "numbers", "words", "key", "data", "path", "size", "low", "high")
_FUNCS = ("clamp", "average", "dedupe", "factorial", "last_item", "merge_dicts",
          "is_palindrome", "count_lines", "count_vowels", "binary_search", "flatten",
          "chunk", "word_count", "reverse_words", "running_sum", "max_gap")
_MODULES = ("utils.py", "numbers_util.py", "text_util.py", "lists.py", "solution.py")
_OPS = ("+", "-", "*", "//", "%")
_COMMANDS = ("python -m pytest -q", "ls", "cat {m}", "python {m}", "python -c 'import {s}'",
             "grep -n def {m}", "head -20 {m}", "wc -l {m}")


def _function(rng: random.Random) -> str:
    name = rng.choice(_FUNCS)
    a, b = rng.sample(_NAMES, 2)
    op = rng.choice(_OPS)
    body = rng.choice((
        f"    {b} = 0\n    for x in {a}:\n        {b} = {b} {op} x\n    return {b}\n",
        f"    if not {a}:\n        return None\n    return {a}[-1]\n",
        f"    return [x for x in {a} if x {op} 2 == 0]\n",
        f"    seen = set()\n    out = []\n    for x in {a}:\n        if x not in seen:\n"
        f"            seen.add(x)\n            out.append(x)\n    return out\n",
        f"    {b} = {{}}\n    for k, v in {a}.items():\n        {b}[k] = v\n    return {b}\n",
    ))
    return f"def {name}({a}):\n{body}"


def _transcript(rng: random.Random) -> str:
    module = rng.choice(_MODULES)
    stem = module.removesuffix(".py")
    func = _function(rng)
    parts = [f"Task: {func.split('(')[0][4:]}() in {module} is wrong; fix it.\n"]
    for _ in range(rng.randint(1, 4)):
        cmd = rng.choice(_COMMANDS).format(m=module, s=stem)
        parts.append(f"RUN: {cmd}\n")
        out = rng.choice(("1 passed", "1 failed, 2 passed", "AssertionError", "ok",
                          f"{rng.randint(1, 40)} {module}", "Traceback (most recent call last):"))
        parts.append(f"exit code {rng.choice((0, 0, 1))}\n{out}\n")
    parts.append(f"WRITE {module}\n```python\n{func}```\nEND\n")
    parts.append("RUN: python -m pytest -q\n")
    parts.append("SUBMIT\n")
    return "".join(parts)


def _sources() -> str:
    chunks: list[str] = []
    total = 0
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).glob("*.py")):
            text = path.read_text(encoding="utf-8")
            if total + len(text) > MAX_SOURCE_CHARS:
                return "".join(chunks)
            chunks.append(f"# file: {folder}/{path.name}\n{text}\n")
            total += len(text)
    return "".join(chunks)


def _tasks() -> str:
    return "".join(p.read_text(encoding="utf-8") + "\n" for p in sorted((ROOT / "real" / "tasks").glob("*.toml")))


def build() -> str:
    rng = random.Random(0)
    transcripts = "\n".join(_transcript(rng) for _ in range(N_TRANSCRIPTS))
    return _tasks() + transcripts + "\n" + _sources()


if __name__ == "__main__":
    out = HERE / "corpus.txt"
    out.write_text(build(), encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes)")
