"""Fuzz: malformed configs, policy specs and cost-model files end in one clean error line.

``parse_config``/``load_config`` must raise ``ConfigError``, ``make_policy`` ``PolicyError``
and ``CostModel.from_file`` ``ConfigError`` -- one line each, nothing else escaping -- and
clearly broken inputs must be rejected while valid ones load. Inputs that trigger a bug
already reported in a module this suite does not own are listed in ``fuzz_kit.PENDING`` and
pinned below by strict ``xfail`` tests.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest
from fuzz_config_cases import ConfigCase, config_cases, config_files, valid_configs
from fuzz_kit import FuzzProperty, expect, materialize, run_property, skip_pending
from fuzz_strategies import (
    HUGE_INT,
    MANY_DIGITS,
    SpecCase,
    TextCase,
    cost_files,
    deep,
    policy_specs,
    toml_document,
)
from hypothesis import given, settings

from rlsched.cluster.errors import ConfigError, PolicyError
from rlsched.config import load_config, parse_config
from rlsched.policies import make_policy
from rlsched.sim.cost import CostModel


def check_config_dict(case: ConfigCase, folder: Path) -> str:
    skip_pending(case.tags)
    return expect(lambda: parse_config(case.data, source="fuzz.toml"), ConfigError, case.must_fail)


def check_config_file(case: TextCase, folder: Path) -> str:
    skip_pending(case.tags)
    path = materialize(case, folder, "config")
    return expect(lambda: load_config(path), ConfigError, case.must_fail)


def check_policy_spec(case: SpecCase, folder: Path) -> str:
    return expect(lambda: make_policy(case.spec), PolicyError, case.must_fail)


def check_cost_file(case: TextCase, folder: Path) -> str:
    skip_pending(case.tags)
    path = materialize(case, folder, "cost")
    return expect(lambda: CostModel.from_file(path), ConfigError, case.must_fail, names=str(path))


PROPERTIES = (
    FuzzProperty("parse_config: config tables", config_cases, check_config_dict, 60),
    FuzzProperty("load_config: config files", config_files, check_config_file, 60),
    FuzzProperty("make_policy: policy specs", policy_specs, check_policy_spec, 80),
    FuzzProperty("CostModel.from_file: cost-model files", cost_files, check_cost_file, 60),
)


@pytest.mark.parametrize("prop", PROPERTIES, ids=lambda p: p.name)
def test_property(prop: FuzzProperty) -> None:
    run_property(prop)


@settings(max_examples=25, deadline=None)
@given(valid_configs())
def test_toml_writer_round_trips(data):
    """The suite's own TOML writer: what the config properties write is what they meant
    (NaN, which TOML allows, compared as NaN: it never equals itself)."""
    assert _nan_as_text(tomllib.loads(toml_document(data))) == _nan_as_text(data)


def _nan_as_text(obj):
    if isinstance(obj, dict):
        return {k: _nan_as_text(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_nan_as_text(v) for v in obj]
    return "nan" if isinstance(obj, float) and obj != obj else obj


# ------------------------------------------------- reported bugs (fuzz_kit.PENDING)
# Each case is the exact input; strict xfail turns red once the bug is fixed, as a
# reminder to drop the tag from PENDING and the mark here.


def _load_config_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    expect(lambda: load_config(path), ConfigError, True)


def _load_cost_text(tmp_path: Path, text: str, suffix: str = ".json") -> None:
    path = tmp_path / f"cost{suffix}"
    path.write_text(text)
    expect(lambda: CostModel.from_file(path), ConfigError, True, names=str(path))


def test_config_deep_nesting(tmp_path):
    _load_config_text(tmp_path, f"x = {deep()}\n")


def test_config_many_digits(tmp_path):
    _load_config_text(tmp_path, f"[run]\nseed = {MANY_DIGITS}\n")


@pytest.mark.parametrize("line", ['seed = "x"', "processor = 3", 'check = "no"', "seed = [1]"])
def test_config_flag_of_wrong_type(line):
    expect(lambda: parse_config(tomllib.loads(f"[run]\n{line}\n"), "c.toml"), ConfigError, True)


@pytest.mark.parametrize("value", ["3", "true", "1.5"])
def test_config_policy_scalar(value):
    expect(lambda: parse_config(tomllib.loads(f"policy = {value}\n"), "c.toml"), ConfigError, True)


@pytest.mark.parametrize("field", ["hbm_bw", "peak_flops", "sync_bw", "switch_s", "decode_bw_eff"])
@pytest.mark.parametrize("value", [1e-300, 5e-324, 1e300, 1.7e308])
def test_cost_extreme_values_rejected_at_load(tmp_path, field, value):
    """Finite but absurd values used to crash or stall the simulator; now one line at load."""
    if field == "switch_s" and value < 1:
        return  # a switch of ~0 s is legitimate (zero is allowed)
    _load_cost_text(tmp_path, f'{{"{field}": {value!r}}}')


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_cost_deep_nesting(tmp_path, suffix):
    _load_cost_text(tmp_path, deep() if suffix == ".json" else f"x = {deep()}\n", suffix)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_cost_many_digits(tmp_path, suffix):
    text = f'{{"hbm_bw": {MANY_DIGITS}}}' if suffix == ".json" else f"hbm_bw = {MANY_DIGITS}\n"
    _load_cost_text(tmp_path, text, suffix)


@pytest.mark.parametrize("field", ["hbm_bw", "layers"])
def test_cost_huge_whole_number(tmp_path, field):
    _load_cost_text(tmp_path, f'{{"{field}": {HUGE_INT}}}')


def test_clearly_broken_examples_fail():
    """A few fixed inputs, so a property that silently stopped generating them still fails."""
    with pytest.raises(ConfigError, match="unknown section 'clustr'"):
        parse_config({"clustr": {}})
    with pytest.raises(ConfigError, match="gpus=6 is not a multiple of tp=4"):
        parse_config({"cluster": {"gpus": 6}})
    with pytest.raises(PolicyError, match="parameter 'tail' given twice"):
        make_policy("elastic:tail=0.5,tail=0.5")
    with pytest.raises(ConfigError, match="expected a finite number"):
        CostModel().with_overrides({"hbm_bw": math.nan})


@pytest.mark.parametrize(("text", "needle"), [
    ('[run]\ngpus = "8"\n', "c.toml: run config: gpus='8': expected an integer >= 1"),
    ("[cluster]\ngpus = 16777216\n", "c.toml: run config: gpus=16777216: expected at most 1,048,576"),
    ("[cluster]\ntp = 2\n[run]\ntp = 4\n", "c.toml: tp is set in both [cluster] and [run]: keep one"),
])
def test_config_value_errors_name_the_file(text, needle):
    """(The run config's own line named the field but not the file; a key in both tables
    was silently the [run] one.)"""
    with pytest.raises(ConfigError) as e:
        parse_config(tomllib.loads(text), "c.toml")
    assert str(e.value) == needle


def test_a_bad_policy_spec_in_a_config_is_refused_at_load():
    """(It was silently ignored when --policy took its place.)"""
    with pytest.raises(ConfigError, match=r"c.toml: \[\[policy\]\] entry 1: policy elastic: unknown parameter 'nosuch'"):
        parse_config(tomllib.loads('[[policy]]\nspec = "colocated"\n[[policy]]\nspec = "elastic:nosuch=1"\n'),
                     "c.toml")
