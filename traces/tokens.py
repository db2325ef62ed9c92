"""Token counting for trace importers: a real tokenizer when the user points to one, else an
estimate -- and the trace always says which (column ``token_source``).

Why an estimate by default: agent logs store text, not token ids, and the exact tokenizer of
the model that wrote them is often unknown or not installed. The default counts
``ceil(characters / 4)`` per piece of text, the rule of thumb from OpenAI's help article
"What are tokens and how to count them?"
(https://help.openai.com/en/articles/4936856-what-are-tokens-and-how-to-count-them: about
four characters of English per token). Code and non-English text usually take more tokens
per character, so the estimate tends to undercount them; pass ``--tokenizer DIR`` for exact
numbers.

With a tokenizer: ``DIR`` is a local Hugging Face tokenizer directory holding
``tokenizer.json``; it is loaded offline with the ``tokenizers`` library
(``Tokenizer.from_file``). ``tokenizers`` is not a core dependency (it comes with the
``live`` extra), so it is imported only here, only when asked for.

Both counters count each piece of text on its own (one message, one observation) without
special tokens or chat-template markup, so the counts are the content the model read or
wrote, not the few framing tokens a chat template adds per message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rlsched.cluster.errors import TraceError, shown

#: ``token_source`` value of the default estimate.
ESTIMATE_SOURCE = "estimate:chars/4"
CHARS_PER_TOKEN = 4
#: Text every tokenizer of a language model encodes to some tokens (words, code,
#: punctuation and a number): checked when ``--tokenizer`` is loaded.
PROBE_TEXT = "def main(): print('Hello, world!')  # 42"


@runtime_checkable
class TokenCounter(Protocol):
    """Anything that turns text into a token count and names itself for ``token_source``."""

    source: str

    def count(self, text: str) -> int: ...


class CharEstimate:
    """``ceil(len(text) / 4)``: OpenAI's ~4 characters per token rule of thumb."""

    source = ESTIMATE_SOURCE

    def count(self, text: str) -> int:
        return -(-len(text) // CHARS_PER_TOKEN)


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` loaded offline with the ``tokenizers`` library."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not path.exists():
            raise TraceError(f"{path}: no such tokenizer directory — expected a local Hugging "
                             f"Face tokenizer directory holding tokenizer.json")
        if not file.is_file():
            raise TraceError(f"{path}: no tokenizer.json in it — expected a local Hugging Face "
                             f"tokenizer directory holding tokenizer.json")
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TraceError("--tokenizer needs the 'tokenizers' library: pip install "
                             "tokenizers") from None
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as err:  # the Rust side raises a plain Exception on bad files
            detail = " ".join(str(err).split())[:120]
            raise TraceError(f"{file}: not a readable tokenizer.json ({detail}) — expected a "
                             f"Hugging Face tokenizers file") from None
        name = (file.parent if file.name == "tokenizer.json" else file).name
        self.source = f"tokenizer:{name}"
        self._file = file
        self._check_encodes()

    def _check_encodes(self) -> None:
        """Refuse, when loaded, a tokenizer that cannot count text: one whose vocabulary
        lacks its own unknown token raised a Rust ``Exception`` traceback on the first word
        it did not know, and one with an empty vocabulary counted every turn as 0 tokens
        and the import wrote a trace of zeros with exit code 0."""
        if self.count(PROBE_TEXT) == 0:
            raise TraceError(f"{self._file}: the tokenizer encodes {PROBE_TEXT!r} as no tokens — "
                             f"expected a tokenizer that counts text (its vocabulary is empty, or it "
                             f"drops what it does not know)")

    def count(self, text: str) -> int:
        if not text:
            return 0
        try:
            return len(self._tok.encode(text, add_special_tokens=False).ids)
        except Exception as err:  # the Rust side raises a plain Exception
            detail = " ".join(str(err).split())[:120]
            raise TraceError(f"{self._file}: the tokenizer fails on {shown(text)} ({detail}) — "
                             f"expected a tokenizer that encodes any text") from None


def load_counter(tokenizer: str | Path | TokenCounter | None) -> TokenCounter:
    """The counter for ``--tokenizer``: None gives the estimate, a path a real tokenizer."""
    if tokenizer is None:
        return CharEstimate()
    if isinstance(tokenizer, str | Path):
        return HFTokenizer(tokenizer)
    if isinstance(tokenizer, TokenCounter):
        return tokenizer
    raise TypeError(f"tokenizer must be a path or a TokenCounter, not {type(tokenizer).__name__}")


def text_of(content: Any) -> str:
    """The text in a message's content, in any of the common shapes.

    A string is itself; a list of parts joins the ``text`` (or ``content``) of each part
    (OpenAI / Anthropic content blocks; image parts carry no text and count nothing); a dict
    is one part; None is empty. Anything else (a number, a nested tool payload) is counted as
    its JSON text, because that is what a chat template would render.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t in (text_of(part) for part in content) if t)
    if isinstance(content, dict):
        for key in ("text", "content", "thinking", "value"):
            if key in content:
                return text_of(content[key])
        if content.get("type") in ("image", "image_url", "input_image"):
            return ""
    return json.dumps(content, ensure_ascii=False, sort_keys=True)


def count_all(counter: TokenCounter, texts: Iterable[str]) -> int:
    """Sum of the counts of several pieces of text (each counted on its own)."""
    return sum(counter.count(t) for t in texts if t)
