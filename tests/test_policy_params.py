"""Issue 22: each policy parameter is declared once -- a field of the policy's frozen config
dataclass, made with ``param`` -- and ``Param``s, defaults, constructor keywords and the
canonical spec all come from it; constructing a policy sets up no run state."""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import pytest

from rlsched.cluster.policy import Configured, Param, param, params_of
from rlsched.policies import available, make_policy
from rlsched.policies.registry import canonical_spec, resolve_params

ROOT = Path(__file__).resolve().parents[1]
# policy modules still in the older style (a Param tuple plus an __init__ that repeats its
# defaults and calls reset(None)); converted at merge, then this set is empty
OLD_STYLE: set[str] = set()


@dataclass(frozen=True)
class _Config:
    rate: float = param("float", 0.5, "a rate", low=0.0, high=1.0)
    mode: str = param("choice", "a", "a mode", choices=("a", "b"), tunable=False)


class _Toy(Configured):
    name: ClassVar[str] = "toy"
    Config = _Config
    max_staleness = 0
    defers = False

    def reset(self, view, rng):  # type: ignore[no-untyped-def]
        raise AssertionError("construction must not reset")


def test_params_come_from_the_config_fields():
    assert _Toy.params == (Param("rate", "float", 0.5, "a rate", low=0.0, high=1.0),
                           Param("mode", "choice", "a", "a mode", choices=("a", "b"), tunable=False))
    toy = _Toy(rate=0.25)  # (its reset raises: construction does not call it)
    assert toy.config == _Config(0.25, "a")
    assert canonical_spec(toy) == "toy:rate=0.25,mode=a"
    with pytest.raises(TypeError):
        _Toy(nope=1)


def test_a_field_without_param_is_refused():
    @dataclass(frozen=True)
    class Bad:
        x: int = 1

    with pytest.raises(TypeError, match=r"Bad.x: declare policy parameters with param"):
        params_of(Bad)


@pytest.mark.parametrize("name", [n for n in available() if issubclass(available()[n], Configured)])
def test_defaults_are_the_config_defaults(name):
    cls = available()[name]
    assert tuple(p.name for p in cls.params) == tuple(f.name for f in fields(cls.Config))
    assert make_policy(name).config == cls.Config()
    assert make_policy(name).config == cls(**resolve_params(cls, {})).config


def test_every_shipped_policy_but_the_old_style_ones_is_configured():
    configured = {n for n, c in available().items() if issubclass(c, Configured)}
    assert configured >= {"async", "colocated", "partial"}
    for n, c in available().items():
        if n not in configured:
            assert Path(c.__module__.replace("rlsched.", "").replace(".", "/") + ".py").name in OLD_STYLE


def test_no_converted_policy_resets_from_its_constructor():
    found = []
    for f in sorted((ROOT / "policies").glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "reset" and node.args
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value is None):
                found.append(f.name)
    assert set(found) <= OLD_STYLE


def test_policies_run_without_a_constructor_reset():
    # reset is what a driver calls before RunStarted; a fresh object needs nothing else
    pol = make_policy("partial:mode=drop")
    assert not hasattr(pol, "_step")
    pol.reset(None, random.Random(0))  # type: ignore[arg-type]
    assert pol._step == 0 and pol.max_staleness == 0 and not pol.defers
