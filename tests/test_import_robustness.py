"""Property: whatever damage a log of the new formats suffers (cut at any byte, any JSON
value swapped for another), its importer either imports it into a valid trace or skips it
with one-line reasons -- never another exception, never a multi-line message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from importkit import FIXTURES, FakeWordCounter

from rlsched.cluster.errors import TraceError
from rlsched.traces.import_common import to_frame
from rlsched.traces.importers import IMPORTERS

WORDS = FakeWordCounter()
FILES = {
    "openhands": [FIXTURES / "openhands" / "output.jsonl",
                  FIXTURES / "openhands" / "output_v1.jsonl"],
    "mini-swe-agent": [FIXTURES / "mini_swe_agent" / "django__django-15814" /
                       "django__django-15814.traj.json",
                       FIXTURES / "mini_swe_agent" / "pytest-dev__pytest-7122.traj.json",
                       FIXTURES / "mini_swe_agent" / "last_mini_run.traj.json"],
    "verl": [FIXTURES / "verl" / "rollout" / "1.jsonl", FIXTURES / "verl" / "rollout" / "2.jsonl"],
}
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=5)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {k: (_replace(v, rest, new) if k == head else v) for k, v in value.items()}
    return [_replace(v, rest, new) if i == head else v for i, v in enumerate(value)]


def _docs(path: Path) -> list[Any]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return [json.loads(text)]


def _write(path: Path, docs: list[Any], jsonl: bool) -> None:
    text = "\n".join(json.dumps(d) for d in docs) + "\n" if jsonl else json.dumps(docs[0])
    path.write_text(text)


def _check(fmt: str, path: Path) -> None:
    try:
        trajs, skipped = IMPORTERS[fmt].read(path, WORDS)
    except TraceError as err:
        assert "\n" not in str(err) and str(err).startswith(str(path)), str(err)
        return
    for where, reason in skipped:
        assert "\n" not in reason and where.startswith(str(path)), reason
    if trajs:
        to_frame(trajs, WORDS.source)  # validates: raises if a row broke the schema


@pytest.mark.parametrize("fmt", list(FILES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_logs_import_or_skip_in_one_line(fmt, tmp_path, data):
    source = data.draw(st.sampled_from(FILES[fmt]))
    target = tmp_path / source.name
    if data.draw(st.booleans()):  # cut the file at any byte
        raw = source.read_bytes()
        target.write_bytes(raw[:data.draw(st.integers(0, len(raw)))])
    else:  # swap one JSON value anywhere for another
        docs = _docs(source)
        i = data.draw(st.integers(0, len(docs) - 1))
        where = data.draw(st.sampled_from(_paths(docs[i])))
        docs[i] = _replace(docs[i], where, data.draw(JSON_VALUES))
        _write(target, docs, source.suffix == ".jsonl")
    _check(fmt, target)
