"""Hypothesis strategies for the malformed-input fuzz suite (issue 9).

Every strategy draws a *case*: the input itself, a label saying what was done to it, and
``must_fail`` -- ``True`` for a clearly broken input (the property then asserts that it
fails), ``False`` for a clearly valid one (it must succeed), ``None`` for "valid but odd, or
broken in a way whose verdict is a judgement call" (succeeding and failing cleanly are both
fine). ``tags`` name known bug triggers (see ``fuzz_kit.PENDING``).

Traces live in :mod:`fuzz_trace_cases` and configs in :mod:`fuzz_config_cases`; this module
holds the shared atoms, file-level damage, the small TOML writer, policy specs and
cost-model files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields

from hypothesis import strategies as st

from rlsched.policies import available
from rlsched.sim.cost import _MAY_BE_ZERO, CostModel

# ------------------------------------------------------------------------------ atoms

#: Text a user could plausibly put in a file or an argument: any Unicode scalar except NUL
#: (no OS path or argv can hold it) and lone surrogates (not encodable as UTF-8).
TEXT_CHARS = st.characters(codec="utf-8", exclude_characters="\x00")
#: Names for identifiers and keys: letters, digits, _ and -, as a typo would look.
NAME = st.text("abcdefghijklmnopqrstuvwxyz_-0123456789", min_size=1, max_size=12)
#: Bytes that are never valid anywhere in UTF-8.
NOT_UTF8 = (b"\xff", b"\xfe", b"\xc0", b"\xc1\xbf", b"\xf8\x88\x80\x80\x80")
#: A number with more digits than Python's default int-from-text limit (4300).
MANY_DIGITS = "9" * 5000
#: A whole number far beyond any float (float(...) overflows).
HUGE_INT = "9" * 400


def deep(depth: int = 100_000) -> str:
    """A JSON/TOML array nested ``depth`` deep: parsers that recurse blow the stack."""
    return "[" * depth + "]" * depth


#: ``cli_must_fail`` default: the command line's verdict is the library call's.
SAME = "same"


@dataclass(frozen=True)
class TextCase:
    """A file to write (``content`` bytes; ``None`` means "make a directory there" and
    ``b"<missing>"`` means "do not create it") and what its verdict must be."""

    label: str
    suffix: str
    content: bytes | None
    must_fail: bool | None
    tags: frozenset[str] = field(default_factory=frozenset)
    cli_must_fail: bool | str | None = SAME  # when the CLI checks more than the library

    @property
    def cli_verdict(self) -> bool | None:
        return self.must_fail if self.cli_must_fail == SAME else self.cli_must_fail  # type: ignore[return-value]

    def __repr__(self) -> str:
        body = "dir" if self.content is None else repr(self.content[:160])
        more = "" if self.content is None or len(self.content) <= 160 else f"+{len(self.content) - 160}B"
        return (f"TextCase({self.label!r}, suffix={self.suffix!r}, must_fail={self.must_fail}, "
                f"tags={sorted(self.tags)}, content={body}{more})")


MISSING = b"<missing>"


def corrupt_text_cases(suffix: str, valid: bytes, tag: str) -> st.SearchStrategy[TextCase]:
    """File-level damage common to every text format, starting from a valid file; ``tag``
    prefixes the tags of known bug triggers (``"config"``, ``"cost"``)."""

    def insert(at: int, junk: bytes) -> bytes:
        at = min(at, len(valid))
        return valid[:at] + junk + valid[at:]

    return st.one_of(
        st.builds(lambda at, b: TextCase("not UTF-8", suffix, insert(at, b), True),
                  st.integers(0, 10_000), st.sampled_from(NOT_UTF8)),
        st.builds(lambda n: TextCase("truncated", suffix, valid[:n], None),
                  st.integers(0, max(len(valid) - 1, 0))),
        st.builds(lambda b: TextCase("garbage bytes", suffix, b, None), st.binary(max_size=200)),
        st.just(TextCase("directory instead of a file", suffix, None, True)),
        st.just(TextCase("no such file", suffix, MISSING, True)),
        st.just(TextCase("nested 100000 deep", suffix, f"x = {deep()}\n".encode()
                         if suffix == ".toml" else deep().encode(), True,
                         frozenset({f"{tag}-deep-nesting"}))),
    )


# ------------------------------------------------------------------------------ TOML


def _toml_str(s: str) -> str:
    out = json.dumps(s, ensure_ascii=False)  # JSON escapes are TOML basic-string escapes
    return out.replace("\x7f", "\\u007f")  # except that TOML also wants DEL escaped


def toml_value(v: object) -> str:
    """One TOML value; dicts become inline tables."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_str(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"no TOML for {type(v).__name__}")


def toml_document(data: dict) -> str:
    """A TOML document for ``data``: scalars first, then ``[table]`` and ``[[array]]``
    sections (so the parser sees the forms users write, not only inline tables)."""
    lines: list[str] = []
    for k, v in data.items():
        if not isinstance(v, dict) and not (isinstance(v, list) and v and all(isinstance(x, dict) for x in v)):
            lines.append(f"{_toml_str(k)} = {toml_value(v)}")
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"[{_toml_str(k)}]")
            lines += [f"{_toml_str(str(kk))} = {toml_value(x)}" for kk, x in v.items()]
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for item in v:
                lines.append(f"[[{_toml_str(k)}]]")
                lines += [f"{_toml_str(str(kk))} = {toml_value(x)}" for kk, x in item.items()]
    return "\n".join(lines) + "\n"


#: Any value TOML can hold (dicts and lists nested a little).
TOML_SCALARS = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(), st.text(TEXT_CHARS, max_size=10)
)
TOML_VALUES = st.recursive(
    TOML_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(TEXT_CHARS, max_size=6), inner, max_size=3)),
    max_leaves=6,
)

# ------------------------------------------------------------------------ policy specs

POLICIES = available()
POLICY_NAMES = tuple(POLICIES)


@dataclass(frozen=True)
class SpecCase:
    label: str
    spec: str
    must_fail: bool | None


def _param_value(p) -> st.SearchStrategy[str]:
    """A value inside the parameter's declared range, written as a user would."""
    if p.kind == "bool":
        return st.sampled_from(["true", "false", "1", "0", "yes", "no", "on", "off", "TRUE", "Off"])
    if p.kind == "choice":
        return st.sampled_from(p.choices)
    low = -1000 if p.low is None else p.low
    high = 1000 if p.high is None else p.high
    if p.kind == "int":
        return st.integers(math.ceil(low), int(min(high, 64))).map(str)
    return st.floats(low, high, allow_nan=False).map(repr)


def _bad_param_value(p) -> st.SearchStrategy[str]:
    """A value no reading of the parameter accepts."""
    junk = ["abc", "nan", "inf", "-inf", "1e400", "--1", "0x1G", "", "½"]
    if p.kind == "bool":
        return st.sampled_from(["maybe", "2", "-1", "tru", "nan", ""])
    if p.kind == "choice":
        return st.text(TEXT_CHARS, max_size=8).filter(lambda s: s.strip() not in p.choices)
    outs = list(junk)
    if p.kind == "int":
        outs += ["1.5", "1e3x"]
        if p.low is not None:
            outs.append(str(math.ceil(p.low) - 1))
        if p.high is not None:
            outs.append(str(int(p.high) + 1))
    else:
        if p.low is not None:
            outs.append(repr(p.low - max(abs(p.low) * 1e-6, 1e-6)))
        if p.high is not None:
            outs.append(repr(p.high + max(abs(p.high) * 1e-6, 1e-6)))
    return st.sampled_from(outs)


def _pad() -> st.SearchStrategy[str]:
    return st.sampled_from(["", " ", "\t", "  "])


@st.composite
def valid_specs(draw) -> SpecCase:
    name = draw(st.sampled_from(POLICY_NAMES))
    params = POLICIES[name].params
    chosen = draw(st.lists(st.sampled_from(params), unique_by=lambda p: p.name)) if params else []
    items = [f"{draw(_pad())}{p.name}{draw(_pad())}={draw(_pad())}{draw(_param_value(p))}"
             for p in chosen]
    spec = name + (":" + ",".join(items) if items else "")
    return SpecCase("in-range parameters", draw(_pad()) + spec + draw(_pad()), False)


@st.composite
def broken_specs(draw) -> SpecCase:
    """A spec with exactly one clear mistake."""
    name = draw(st.sampled_from(POLICY_NAMES))
    params = POLICIES[name].params
    kinds = ["unknown name", "unknown parameter", "empty", "missing =", "empty value",
             "empty item", "empty parameter list"]
    if params:
        kinds += ["bad value", "duplicated key"]
    kind = draw(st.sampled_from(kinds))
    if kind == "unknown name":
        other = draw(st.text(TEXT_CHARS, min_size=1, max_size=12).filter(
            lambda s: s.partition(":")[0].strip() not in POLICIES and s.partition(":")[0].strip()))
        return SpecCase(kind, other, True)
    if kind == "empty":
        return SpecCase(kind, draw(st.sampled_from(["", " ", ":", " :x=1", "\t"])), True)
    if kind == "empty parameter list":
        return SpecCase(kind, name + draw(st.sampled_from([":", ": ", ":\t"])), True)
    if kind == "unknown parameter":
        key = draw(NAME.filter(lambda k: k not in {p.name for p in params}))
        return SpecCase(kind, f"{name}:{key}=1", True)
    if kind in ("missing =", "empty value", "empty item"):
        key = params[0].name if params else "x"
        spec = {"missing =": f"{name}:{key}", "empty value": f"{name}:{key}=",
                "empty item": f"{name}:{key}=1,," if params else f"{name}:,"}[kind]
        return SpecCase(kind, spec, True)
    p = draw(st.sampled_from(params))
    if kind == "bad value":
        return SpecCase(f"bad value for {p.name}", f"{name}:{p.name}={draw(_bad_param_value(p))}", True)
    v = draw(_param_value(p))
    return SpecCase(kind, f"{name}:{p.name}={v},{p.name}={v}", True)


#: Junk punctuation around real names: anything may happen, but only cleanly.
JUNK_SPECS = st.builds(
    lambda parts: SpecCase("junk punctuation", "".join(parts), None),
    st.lists(st.sampled_from(list(":,= \t;!@#-_.") + list(POLICY_NAMES) + ["tail", "0.5", "x"]),
             max_size=12),
)


def policy_specs() -> st.SearchStrategy[SpecCase]:
    return st.one_of(valid_specs(), broken_specs(), JUNK_SPECS)


# ------------------------------------------------------------------------ cost models

COST_FIELDS = {f.name: f for f in fields(CostModel)}
#: Fields in "do the weights fit in GPU memory?": valid cases only move them the safe way.
_SHRINK_ONLY = {"params", "bytes_per_param", "layers", "kv_heads", "head_dim", "kv_bytes_per_elem"}
_GROW_ONLY = {"hbm_bytes"}


@st.composite
def valid_cost_fields(draw) -> dict:
    """A few fields moved by a factor of 0.5..2 around the defaults (weights still fit)."""
    out = {}
    default = CostModel()
    for name in draw(st.sets(st.sampled_from(sorted(COST_FIELDS)), max_size=5)):
        lo, hi = (0.5, 1.0) if name in _SHRINK_ONLY else (1.0, 2.0) if name in _GROW_ONLY else (0.5, 2.0)
        if name == "gpu_mem_util":
            lo, hi = 0.9, 1.0
        value = getattr(default, name) * draw(st.floats(lo, hi))
        if COST_FIELDS[name].type in ("int", int):
            value = max(1, int(value))
        elif name in _MAY_BE_ZERO and draw(st.booleans()):
            value = 0.0
        out[name] = value
    return out


@st.composite
def cost_files(draw) -> TextCase:
    suffix = draw(st.sampled_from([".toml", ".json"]))
    fields_ = draw(valid_cost_fields())
    kind = draw(st.sampled_from(["valid", "unknown field", "not finite", "negative", "zero",
                                 "not a number", "huge whole number", "extreme but finite",
                                 "file damage", "many digits", "not a table"]))
    must_fail: bool | None = True
    tags: frozenset[str] = frozenset()
    name = draw(st.sampled_from(sorted(COST_FIELDS)))
    if kind == "valid":
        must_fail = False
    elif kind == "unknown field":
        fields_[draw(NAME.filter(lambda k: k not in COST_FIELDS and k != "cost"))] = 1.0
    elif kind == "not finite":
        fields_[name] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    elif kind == "negative":
        fields_[name] = -draw(st.floats(min_value=1e-300, max_value=1e300))
    elif kind == "zero":
        name = draw(st.sampled_from(sorted(set(COST_FIELDS) - _MAY_BE_ZERO)))
        fields_[name] = draw(st.sampled_from([0, 0.0]))
    elif kind == "not a number":
        fields_[name] = draw(st.one_of(st.text(TEXT_CHARS, max_size=5), st.booleans(),
                                       st.lists(st.integers(), max_size=2),
                                       st.dictionaries(NAME, st.integers(), max_size=1)))
    elif kind == "extreme but finite":
        # Valid to the validator; a simulation with them must still end cleanly.
        fields_[name] = draw(st.sampled_from([1e-300, 5e-324, 1e300, 1.7e308]))
        must_fail = None
        tags = frozenset({"cost-extreme"})
    elif kind == "not a table":
        text = draw(st.sampled_from(['[1, 2]', '3', '"cost"', 'null'])) if suffix == ".json" \
            else 'cost = 3\n'
        return TextCase(kind, suffix, text.encode(), True)
    valid_text = _cost_text(suffix, fields_, draw(st.booleans()))
    if kind == "file damage":
        return draw(corrupt_text_cases(suffix, valid_text, "cost"))
    if kind == "huge whole number":
        # ``9...9`` (400 digits) written as an integer: finite as text, not as a float.
        placeholder = 1234567.0
        text = _cost_text(suffix, {**fields_, name: placeholder}, False)
        return TextCase(f"{kind} for {name}", suffix, text.replace(
            repr(placeholder).encode(), HUGE_INT.encode()), True, frozenset({"cost-huge-int"}))
    if kind == "many digits":
        text = _cost_text(suffix, {**fields_, name: 1234567.0}, False)
        return TextCase(f"{kind} for {name}", suffix, text.replace(
            b"1234567.0", MANY_DIGITS.encode()), True, frozenset({"cost-many-digits"}))
    return TextCase(f"{kind}: {name}" if kind != "valid" else kind, suffix, valid_text,
                    must_fail, tags)


def _cost_text(suffix: str, values: dict, wrapped: bool) -> bytes:
    data = {"cost": values} if wrapped else values
    if suffix == ".json":
        return json.dumps(data).encode()  # NaN/Infinity literals: Python's json reads them
    return toml_document(data).encode()
