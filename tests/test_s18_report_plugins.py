"""User errors around reports, plugins and config tables end in one line, not a traceback.

* fault durations near float's limit (``restart_s = 1e308``) are refused when the config is
  read (the run's times overflowed to inf and the report's plot failed in matplotlib);
* ``rlsched report A B`` of runs of different traces, clusters or cost models says so;
* a policy plugin whose ``params`` are not ``Param`` records, whose constructor rejects its
  parameters, or whose ``on_event`` returns None or raises: ``policy check`` FAILs in one
  line (exit 1), ``run``/``compare`` end in one line naming the plugin and the defect;
* ``policy list`` through a pipe prints whole lines (rich cut them at 80 columns);
* an unknown ``[live]`` key is refused when the config is read, simulated run or not.
"""

from __future__ import annotations

import math
import re
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from rlsched.analysis.comparable import setup_differences
from rlsched.analysis.plots import plot_held_back
from rlsched.analysis.style import png_bytes
from rlsched.cli import main
from rlsched.cluster.config import RunConfig
from rlsched.cluster.errors import ConfigError
from rlsched.cluster.faults import Fault, FaultSchedule, parse_faults
from rlsched.config import parse_config
from rlsched.policies import make_policy, registry
from rlsched.sim.run import simulate
from rlsched.sim.workload import Workload

from simkit import ABC, HAND_COST

SMALL_RUN = ["--steps", "1", "--tasks-per-step", "2", "--gpus", "4", "--tp", "1", "--model", "none"]


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("rlsched: error: "), err
    return lines[0]


# ------------------------------------------------------------ 1. huge fault durations
@pytest.mark.parametrize("key", ["recover_s", "restart_s", "tool_timeout_s", "sync_retry_s"])
def test_a_fault_duration_past_the_limit_is_refused_in_one_line(key):
    table = {key: 1e308, "fault": [{"kind": "trainer", "per_hour": 3}]}
    with pytest.raises(ConfigError, match=rf"^f\.toml: \[faults\] {key}=1e\+308: expected .*at most 1e\+09"):
        parse_faults(table, "f.toml")
    assert getattr(parse_faults({**table, key: 1e9}, "f.toml"), key) == 1e9  # (about 32 years)


def test_a_gpu_fault_recover_s_past_the_limit_is_refused():
    with pytest.raises(ConfigError, match=r"entry 0: fault 'gpu': recover_s=1e\+300: expected .*at most"):
        parse_faults({"fault": [{"kind": "gpu", "at": 5.0, "recover_s": 1e300}]}, "f.toml")
    with pytest.raises(ConfigError, match="at most"):
        FaultSchedule((Fault("trainer", at=1.0),), restart_s=1e308)


def test_run_with_restart_s_1e308_ends_in_one_line(tmp_path, capsys):
    """(async: the trainer fault's restart made every time ~1e308, their sums inf, and the
    report's "what held the steps back" plot raised ValueError inside matplotlib.)"""
    cfg = tmp_path / "f.toml"
    cfg.write_text('[faults]\nrestart_s = 1e308\n[[faults.fault]]\nkind = "trainer"\nat = 1300\n')
    code = main(["run", "--policy", "async", "--steps", "2", "--tasks-per-step", "4", "--gpus", "16",
                 "--tp", "2", "--model", "none", "--config", str(cfg), "--out", str(tmp_path / "r")])
    assert code == 2
    assert "restart_s=1e+308" in one_error_line(capsys.readouterr().err)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (numpy and matplotlib say inf was met)
def test_the_held_back_plot_survives_times_that_sum_to_inf():
    # (summed over steps, 1e308 s of training per step overflowed to inf in the summary)
    summary = pd.DataFrame({"policy": ["a", "b"], "steps_start_delay_s": [1e308, 5.0],
                            "steps_tail_slowdown_s": [1e308, 3.0], "steps_after_rollout_s": [math.inf, 1.0]})
    ax = plot_held_back(summary)
    assert png_bytes(ax.figure)
    assert all(math.isfinite(x) for x in ax.get_xlim())


# ------------------------------------------------------------ 2. report of unlike runs
def _record(tmp_path: Path, name: str, trace: Path, *, gpus: int = 2, cost=HAND_COST) -> Path:
    out = tmp_path / name
    w = Workload.from_frame(pd.read_parquet(trace))
    simulate(w, [[("A", "A"), ("B", "B"), ("C", "C")]], make_policy("colocated"),
             RunConfig(gpus=gpus, tp=1, steps=1), cost, out_dir=out, spec="colocated",
             meta={"trace": str(trace)})
    return out


@pytest.fixture
def traces(tmp_path):
    a, same, other = tmp_path / "a.parquet", tmp_path / "copy-of-a.parquet", tmp_path / "b.parquet"
    ABC.to_parquet(a)
    ABC.to_parquet(same)
    ABC.assign(output_tokens=ABC["output_tokens"] * 2).to_parquet(other)
    return a, same, other


def test_report_of_runs_of_different_traces_and_clusters_warns_in_one_line(tmp_path, traces, capsys):
    a, _, other = traces
    r1 = _record(tmp_path, "r1", a, gpus=2)
    r2 = _record(tmp_path, "r2", other, gpus=4)
    assert main(["report", str(r1), str(r2), "--out", str(tmp_path / "rep")]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("rlsched: warning: "), err
    assert "trace (a.parquet vs b.parquet)" in err[0] and "gpus (2 vs 4)" in err[0]
    assert "differ in trace" in (tmp_path / "rep" / "report.html").read_text()


def test_report_of_runs_of_one_setup_says_nothing(tmp_path, traces, capsys):
    a, same, _ = traces
    r1, r2 = _record(tmp_path, "r1", a), _record(tmp_path, "r2", same)  # (same bytes: one trace)
    assert main(["report", str(r1), str(r2), "--out", str(tmp_path / "rep")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert "differ in" not in (tmp_path / "rep" / "report.html").read_text()


def test_setup_differences_names_tp_cost_fields_and_same_named_traces(tmp_path, traces):
    a, _, other = traces
    moved = tmp_path / "elsewhere" / "a.parquet"
    moved.parent.mkdir()
    moved.write_bytes(other.read_bytes())
    meta = {"trace": str(a), "num_gpus": 8, "tp": 1, "cost_model": {"switch_s": 8.0, "hbm_bw": 1e9}}
    runs = [(tmp_path, meta),
            (tmp_path, {**meta, "trace": str(moved), "tp": 2, "cost_model": {"switch_s": 1.0, "hbm_bw": 1e9}})]
    assert setup_differences(runs) == [
        "trace (a.parquet: files with different contents)", "tp (1 vs 2)", "cost model (switch_s 8 vs 1)"]
    assert setup_differences(runs[:1]) == []


# ------------------------------------------------------------ 3. broken policy plugins
PLUGIN_SOURCE = textwrap.dedent('''
    from rlsched.cluster.policy import Param
    from rlsched.policies.colocated import Colocated

    class Fine(Colocated):
        name = "s18_fine"

    class StrParams(Colocated):
        name = "s18_strparams"
        params = ("x",)

    class BadInit(Colocated):
        name = "s18_badinit"
        params = (Param("x", "int", 1, "an x"),)

        def __init__(self, **values):
            raise TypeError("BadInit() takes no parameters")

    class NoneEvent(Colocated):
        name = "s18_noneevent"

        def on_event(self, event, view):
            return None

    class RaiseEvent(Colocated):
        name = "s18_raiseevent"

        def on_event(self, event, view):
            raise ZeroDivisionError("division by zero")
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """Install one policy of PLUGIN_SOURCE as an entry point of a distribution in tmp_path
    (a module and its .dist-info on sys.path, as pip would leave them); the registry forgets
    it afterwards."""
    module = "s18_" + re.sub(r"\W", "_", tmp_path.name)

    def install(cls: str) -> str:
        name = "s18_" + cls.lower()
        (tmp_path / f"{module}.py").write_text(PLUGIN_SOURCE)
        info = tmp_path / f"{module}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{name} = {module}:{cls}\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
        monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", False)
        return name

    yield install
    sys.modules.pop(module, None)


@pytest.mark.parametrize(("cls", "defect"), [
    ("StrParams", r"params\[0\] is 'x', not a Param record"),
    ("BadInit", r"its constructor rejected its parameters \(x=1\): TypeError: BadInit\(\) takes no parameters"),
    ("NoneEvent", r"on_event\(RunStarted at t=0s\) returned None: expected a list of commands"),
    ("RaiseEvent", r"on_event\(RunStarted at t=0s\) raised ZeroDivisionError: division by zero"),
])
def test_policy_check_of_a_broken_plugin_fails_in_one_line(plugin, capsys, cls, defect):
    name = plugin(cls)
    assert main(["policy", "check", name]) == 1
    out = capsys.readouterr().out
    fails = [ln for ln in out.splitlines() if ln.lstrip().startswith("FAIL")]
    assert len(fails) == 1, out
    assert f"policy plugin {name!r}" in fails[0] and re.search(defect, fails[0]), out


@pytest.mark.parametrize(("cls", "defect"), [
    ("StrParams", r"params\[0\] is 'x'"),
    ("BadInit", r"constructor rejected its parameters .*TypeError"),
    ("NoneEvent", r"on_event\(RunStarted at t=0s\) returned None"),
    ("RaiseEvent", r"on_event\(RunStarted at t=0s\) raised ZeroDivisionError: division by zero"),
])
@pytest.mark.parametrize("verb", ["run", "compare"])
def test_run_and_compare_with_a_broken_plugin_end_in_one_line(plugin, tmp_path, capsys, cls, defect, verb):
    name = plugin(cls)
    code = main([verb, "--policy", name, *SMALL_RUN, "--out", str(tmp_path / "out")])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2
    assert f"policy plugin {name!r}" in line and re.search(defect, line), line


def test_another_plugins_defect_is_an_error_not_a_fail_of_the_policy_checked(plugin, capsys):
    plugin("StrParams")
    assert main(["policy", "check", "colocated"]) == 2
    assert "params[0] is 'x'" in one_error_line(capsys.readouterr().err)


def test_a_sound_plugin_is_unchanged_by_the_guard(plugin, capsys):
    name = plugin("Fine")
    assert main(["policy", "check", name]) == 0
    assert "conforms" in capsys.readouterr().out
    policy = make_policy(name)
    assert isinstance(policy, sys.modules[type(policy).__module__].Fine)
    assert (policy.name, policy.params, type(policy).__qualname__) == (name, (), "Fine")
    assert type(make_policy("colocated")) is registry._REGISTRY["colocated"]  # shipped: not wrapped
    assert type(make_policy("colocated")).__module__ == "rlsched.policies.colocated"


# ------------------------------------------------------------ 4. policy list in a pipe
def test_policy_list_off_a_terminal_prints_whole_lines(capsys):
    assert main(["policy", "list"]) == 0
    out = capsys.readouterr().out
    from rlsched.policies import available

    for name, cls in available().items():
        for p in cls.params:
            assert any(p.name in ln and p.help in ln for ln in out.splitlines()), (name, p.name)
    assert max(len(ln) for ln in out.splitlines()) > 80


# ------------------------------------------------------------ 5. [live] keys
def test_an_unknown_live_key_is_refused_when_the_config_is_read():
    with pytest.raises(ConfigError, match=r"^c\.toml: \[live\] unknown key 'temprature' \(did you mean 'temperature'\?\)$"):
        parse_config({"live": {"temprature": 1.0}}, source="c.toml")
    assert parse_config({"live": {"temperature": 0.5}}).live == {"temperature": 0.5}


def test_a_simulated_run_refuses_an_unknown_live_key(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[live]\nbogus = 1\n")
    code = main(["run", "--policy", "colocated", *SMALL_RUN, "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert code == 2
    assert "[live] unknown key 'bogus'" in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "o").exists()
