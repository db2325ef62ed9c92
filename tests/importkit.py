"""Shared bits of the importer tests: fixture paths and a named fake token counter."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "import"
SWE = FIXTURES / "swe_agent"
BROKEN = FIXTURES / "broken"
MESSAGES = FIXTURES / "messages.jsonl"


class FakeWordCounter:
    """FAKE tokenizer for unit tests only: one token per whitespace-separated word, so the
    fixtures' expected counts can be checked by hand."""

    source = "fake:words"

    def count(self, text: str) -> int:
        return len(text.split())
