"""Hypothesis strategies for run configurations (``[cluster]``, ``[run]``, ``[cost]``,
``[[policy]]``, ...): valid configs, configs with one clear mistake, random tables, and
config files damaged at the byte level. See :mod:`fuzz_strategies` for the case rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from fuzz_strategies import (
    COST_FIELDS,
    MANY_DIGITS,
    NAME,
    SAME,
    TEXT_CHARS,
    TOML_SCALARS,
    TOML_VALUES,
    TextCase,
    broken_specs,
    corrupt_text_cases,
    toml_document,
    valid_cost_fields,
    valid_specs,
)
from hypothesis import strategies as st

from rlsched.cluster.config import RunConfig
from rlsched.real.config import LiveSettings

_COUNTS = ("gpus", "tp", "steps", "sandbox_slots", "tasks_per_step", "samples_per_task")
_FLAGS = ("seed", "processor", "check")
_RUN_KEYS = tuple(f.name for f in fields(RunConfig))
_SECTIONS = ("cluster", "run", "cost", "policy", "live", "trace", "faults")
_LIVE_KEYS = tuple(f.name for f in fields(LiveSettings))
_LIVE_DEFAULTS = {f.name: f.default for f in fields(LiveSettings)}


def _live_value(key: str) -> st.SearchStrategy:
    """A value [live] ``key`` accepts (session 19: values are checked when a file is read,
    not only its keys): any flag or text, and the default for a number (numbers have ranges
    and one cross-check, max_tokens_per_turn < max_model_len)."""
    default = _LIVE_DEFAULTS[key]
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, tuple):
        return st.lists(st.text(TEXT_CHARS, max_size=5), max_size=2)
    if default is None or isinstance(default, str):
        return st.text(TEXT_CHARS, max_size=8)
    return st.just(default)


#: [live] values that are refused: a wrong type, out of range, not finite.
_BAD_LIVE = ({"tasks_per_step": 0}, {"tasks_per_step": False}, {"model": False},
             {"temperature": math.nan}, {"temperature": -1.0}, {"tool_seconds": math.inf},
             {"lr": "fast"}, {"gpus": -1}, {"max_tokens_per_turn": 5000})


@dataclass(frozen=True)
class ConfigCase:
    label: str
    data: dict
    must_fail: bool | None
    cli_must_fail: bool | str | None = SAME  # when the CLI checks more than parse_config
    tags: frozenset[str] = field(default_factory=frozenset)

    @property
    def cli_verdict(self) -> bool | None:
        return self.must_fail if self.cli_must_fail == SAME else self.cli_must_fail  # type: ignore[return-value]


@st.composite
def valid_configs(draw, *, small: bool = True) -> dict:
    """A config that parses; ``small`` keeps it cheap to simulate (the CLI overrides
    --gpus/--steps anyway)."""
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    run = {"gpus": tp * draw(st.integers(2, 8)), "tp": tp, "steps": draw(st.integers(1, 3))}
    # (tasks_per_step at most 2: the CLI fuzz replays a trace of 2 tasks, and since session 20
    # a step draws each task at most once -- 3 is refused, not a valid config there;
    # samples_per_task at most 2: its tasks hold 2 trajectories each, and since session 21 a
    # cap above every group is refused)
    for key, strat in (("tasks_per_step", st.integers(1, 2)), ("samples_per_task", st.integers(1, 2)),
                       ("seed", st.integers(0, 2**31)), ("sandbox_slots", st.integers(1, 4096)),
                       ("processor", st.booleans()), ("check", st.booleans())):
        if draw(st.booleans()):
            run[key] = draw(strat)
    split = draw(st.sets(st.sampled_from(sorted(run))))
    data: dict = {}
    cluster = {k: v for k, v in run.items() if k in split}
    rest = {k: v for k, v in run.items() if k not in split}
    if cluster:
        data["cluster"] = cluster
    if rest:
        data["run"] = rest
    if draw(st.booleans()):
        data["cost"] = draw(valid_cost_fields())
    if draw(st.booleans()):
        data["policy"] = [{"spec": draw(valid_specs()).spec.strip()} for _ in range(draw(st.integers(1, 2)))]
    if draw(st.booleans()):
        # (known keys and values they take: an unknown key or a wrong value is refused when
        # the file is read, live run or not)
        keys = draw(st.lists(st.sampled_from(_LIVE_KEYS), max_size=2, unique=True))
        data["live"] = {k: draw(_live_value(k)) for k in keys}
    return data


def _wrong_type(key: str) -> st.SearchStrategy:
    base = [st.text(TEXT_CHARS, max_size=5), st.lists(st.integers(), max_size=2),
            st.dictionaries(NAME, st.integers(), max_size=1)]
    if key in ("processor", "check"):
        base += [st.integers(), st.floats()]
    else:
        base += [st.floats().filter(lambda x: not float(x).is_integer() or x != x or math.isinf(x)),
                 st.sampled_from([8.0, 2.0]), st.booleans()]
    return st.one_of(base)


@st.composite
def broken_configs(draw) -> ConfigCase:
    """A valid config with exactly one clear mistake."""
    data = draw(valid_configs())
    kind = draw(st.sampled_from([
        "unknown section", "unknown key", "count of the wrong type", "flag of the wrong type",
        "zero or negative count", "gpus not a multiple of tp", "a single engine",
        "section not a table", "bad [[policy]]", "trace not a string", "unknown cost field",
        "bad policy spec", "unknown [live] key", "bad [live] value",
    ]))
    run_tables = [s for s in ("cluster", "run") if s in data] or ["run"]
    table = draw(st.sampled_from(run_tables))
    data.setdefault(table, {})
    if kind == "unknown section":
        data[draw(NAME.filter(lambda k: k not in _SECTIONS))] = draw(TOML_VALUES)
    elif kind == "unknown key":
        data[table][draw(NAME.filter(lambda k: k not in _RUN_KEYS))] = draw(TOML_SCALARS)
    elif kind == "unknown [live] key":
        live = data["live"] if isinstance(data.get("live"), dict) else {}
        data["live"] = {**live, draw(NAME.filter(lambda k: k not in _LIVE_KEYS)): draw(TOML_SCALARS)}
    elif kind == "bad [live] value":
        live = data["live"] if isinstance(data.get("live"), dict) else {}
        bad = draw(st.sampled_from(_BAD_LIVE))
        data["live"] = {**live, **bad}
        return ConfigCase(f"{kind}: {bad!r}", data, True)
    elif kind == "count of the wrong type":
        key = draw(st.sampled_from(_COUNTS))
        _drop(data, key)
        data[table][key] = draw(_wrong_type(key))
    elif kind == "flag of the wrong type":
        key = draw(st.sampled_from(_FLAGS))
        _drop(data, key)
        data[table][key] = draw(_wrong_type(key))
        return ConfigCase(f"{kind}: {key}", data, True, tags=frozenset({"config-flag-type"}))
    elif kind == "zero or negative count":
        key = draw(st.sampled_from(_COUNTS))
        _drop(data, key)
        data[table][key] = draw(st.integers(-(2**63), 0))
    elif kind == "gpus not a multiple of tp":
        tp = draw(st.sampled_from([2, 4, 8]))
        _drop(data, "gpus")
        _drop(data, "tp")
        data[table].update(gpus=tp * draw(st.integers(2, 8)) + draw(st.integers(1, tp - 1)), tp=tp)
    elif kind == "a single engine":
        tp = draw(st.sampled_from([1, 2, 4, 8]))
        _drop(data, "gpus")
        _drop(data, "tp")
        data[table].update(gpus=tp, tp=tp)
    elif kind == "section not a table":
        section = draw(st.sampled_from(["cluster", "run", "cost", "live"]))
        data[section] = draw(st.one_of(TOML_SCALARS, st.lists(st.integers(), max_size=2)))
    elif kind == "bad [[policy]]":
        bad = draw(st.sampled_from([3, True, 1.5, [3], [{}], [{"spec": 3}],
                                    [{"spec": "colocated", "extra": 1}], [[]]]))
        tags = frozenset({"config-policy-scalar"}) if not isinstance(bad, list | str) else frozenset()
        data["policy"] = bad
        return ConfigCase(f"{kind}: {bad!r}", data, True, tags=tags)
    elif kind == "trace not a string":
        data["trace"] = draw(st.one_of(st.integers(), st.lists(st.integers(), max_size=2),
                                       st.dictionaries(NAME, st.integers(), max_size=1)))
    elif kind == "unknown cost field":
        data["cost"] = {draw(NAME.filter(lambda k: k not in COST_FIELDS)): 1.0}
        return ConfigCase(kind, data, None, cli_must_fail=True)
    else:  # bad policy spec: parse_config checks each spec (session 17), as the CLI must
        data["policy"] = [{"spec": draw(broken_specs()).spec}]
        return ConfigCase(kind, data, True, cli_must_fail=True)
    return ConfigCase(kind, data, True)


def _drop(data: dict, key: str) -> None:
    for section in ("cluster", "run"):
        if isinstance(data.get(section), dict):
            data[section].pop(key, None)


def config_cases() -> st.SearchStrategy[ConfigCase]:
    # A valid [[policy]] spec may still be unable to run on a given cluster (e.g. elastic
    # with min_engines >= the engines there are): the CLI may then fail, cleanly.
    return st.one_of(valid_configs().map(lambda d: ConfigCase(
                         "valid", d, False, cli_must_fail=None if "policy" in d else False)),
                     broken_configs(),
                     st.dictionaries(st.one_of(st.sampled_from(_SECTIONS), NAME), TOML_VALUES,
                                     max_size=3).map(_random_tables))


def _random_tables(data: dict) -> ConfigCase:
    scalar_policy = isinstance(data.get("policy"), bool | int | float)
    return ConfigCase("random tables", data, None,
                      tags=frozenset({"config-policy-scalar"}) if scalar_policy else frozenset())


@st.composite
def config_files(draw) -> TextCase:
    """A config file on disk: a rendered config case, or damage to the file itself."""
    case = draw(config_cases())
    text = toml_document(case.data).encode()
    rendered = TextCase(f"config: {case.label}", ".toml", text, case.must_fail, case.tags,
                        case.cli_must_fail)
    return draw(st.one_of(
        st.just(rendered),
        corrupt_text_cases(".toml", text, "config"),
        st.just(TextCase("key given twice", ".toml", b'trace = "a"\ntrace = "b"\n' + text, True)),
        st.just(TextCase(f"{len(MANY_DIGITS)}-digit number", ".toml",
                         f"[run]\nseed = {MANY_DIGITS}\n".encode(), True,
                         frozenset({"config-many-digits"}))),
        st.just(TextCase("empty file (all defaults)", ".toml", b"", False)),
        st.builds(lambda t: TextCase("TOML-ish junk", ".toml", t.encode(), None),
                  st.text(st.sampled_from(list('[]={}"\'.,#\n =abc123')), max_size=40)),
    ))
