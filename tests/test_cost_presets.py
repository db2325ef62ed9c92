"""The preset cost model's derived figures against hand calculations (one dense and one
MoE preset), the default model unchanged, and the trainer floor enforced by the
simulator and respected by the lower bound."""

from __future__ import annotations

import math

import pytest

from rlsched.cluster.commands import Reassign
from rlsched.cluster.errors import ConfigError, PolicyError
from rlsched.cluster.ids import Role
from rlsched.cluster.legality import check as legality_check
from rlsched.cluster.state import ClusterState
from rlsched.sim.cost import CostModel
from rlsched.sim.engine import EngineSim
from rlsched.sim.memory import (
    NO_FLOOR,
    min_engine_gpus,
    reshard_s,
    train_job_s,
    train_layout,
    train_memory,
)
from rlsched.sim.presets import GPUS, MODELS, preset_cost, resolve_cost

REL = dict(rel=1e-9)
DENSE = preset_cost("qwen2.5-32b", "h200")
MOE = preset_cost("qwen3-30b-a3b", "h100")


# ------------------------------------------------------------------------ no preset
def test_default_model_has_no_floor_and_flat_figures() -> None:
    c = CostModel()
    assert not c.modelled and not c.moe and c.gpus_per_node == 0
    assert train_layout(c) is NO_FLOOR
    # the historic formulas, written out by hand
    assert c.sync_s() == 1.0 + 65e9 / 25e9
    assert c.sync_s(4, True) == c.sync_s()  # no topology: placement does not matter
    mem = (65e9 + 262144 * 1e5) / (4 * 4.8e12 * 0.6)
    comp = 2 * 32.5e9 * 8 / (4 * 989e12 * 0.5)
    assert c.decode_step_s(4, 8, 1e5) == 0.004 + max(mem, comp)
    assert c.migrate_s(4, 1000) == (262144 * 1000 / 50e9, False)


# ------------------------------------------------------------------------ dense
def test_dense_memory_floor_by_hand() -> None:
    lay = train_layout(DENSE)
    # 32.5B params, 128k tokens: tp 4 x dp 2 holds it, nothing with 4 GPUs can
    # (18 bytes/param of state over 4 GPUs = 146 GB > 126.9 GB usable)
    assert (lay.tp, lay.pp, lay.cp, lay.min_dp) == (4, 1, 1, 2)
    assert lay.min_gpus == 8 and lay.unit == 4
    m = lay.memory
    assert m.weights == pytest.approx(32.5e9 * 2 / 4, **REL)
    assert m.grads == pytest.approx(32.5e9 * 4 / 4, **REL)
    assert m.optimizer == pytest.approx(32.5e9 * 12 / (4 * 2), **REL)
    assert m.activations == pytest.approx(131072 / 4 * 5120 * (2 * 64 + 34), **REL)
    assert m.capacity == pytest.approx(141e9 * 0.9, **REL)
    assert m.total <= m.capacity
    assert not train_memory(DENSE, 4, 1, 1, 1).fits
    assert m.capacity < 32.5e9 * 18 / 4  # why no 4-GPU layout exists
    assert lay.usable(7) == 0 and lay.usable(8) == 8 and lay.usable(11) == 8 and lay.usable(12) == 12


def test_dense_kv_sync_decode_by_hand() -> None:
    c = DENSE
    assert c.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2
    assert c.kv_capacity_tokens(4) == int((4 * 141e9 * 0.9 - 65e9) // 262144)
    assert c.sync_s(4, True) == pytest.approx(1.0 + 65e9 / (4 * 450e9), **REL)
    assert c.sync_s(4, False) == pytest.approx(1.0 + 65e9 / (4 * 50e9), **REL)
    assert c.sync_s(4, False) > c.sync_s(4, True)
    mem = (65e9 + 262144 * 1e5) / (4 * 4.8e12 * 0.6)
    assert c.decode_step_s(4, 8, 1e5) == pytest.approx(0.004 + mem, **REL)
    assert c.migrate_s(4, 1000)[0] == pytest.approx(262144 * 1000 / (4 * 50e9), **REL)


def test_dense_training_and_resharding_by_hand() -> None:
    c, lay = DENSE, train_layout(DENSE)
    flops = c.train_flops(131072.0) * 4
    # 16 GPUs = dp 4, across two 8-GPU domains: compute + ring reduce of bf16 grads
    t = train_job_s(c, lay, flops, 4 * 131072.0, 16, spans_nodes=True)
    grads = 32.5e9 / 4 * 2 * 2 * (4 - 1) / 4
    assert t == pytest.approx(flops / (16 * 989e12 * 0.35) + grads / 50e9, **REL)
    within = train_job_s(c, lay, flops, 4 * 131072.0, 16, spans_nodes=False)
    assert within == pytest.approx(flops / (16 * 989e12 * 0.35) + grads / 450e9, **REL)
    # 14 GPUs use 12 (three replicas of 4), and pay the reduction over 3 replicas
    t14 = train_job_s(c, lay, flops, 0.0, 14, spans_nodes=True)
    assert t14 == pytest.approx(flops / (12 * 989e12 * 0.35) + 32.5e9 / 4 * 2 * 2 * 2 / 3 / 50e9, **REL)
    with pytest.raises(ValueError, match="below the floor"):
        train_job_s(c, lay, flops, 0.0, 4, spans_nodes=False)
    # growing 8 -> 16: each new GPU receives its state at 16 (optimizer sharded over 4)
    state16 = 32.5e9 / 4 * (2 + 4) + 32.5e9 * 12 / 16
    assert reshard_s(c, lay, 8, 16, local=False) == pytest.approx(state16 / 50e9, **REL)
    assert reshard_s(c, lay, 8, 16, local=True) == pytest.approx(state16 / 450e9, **REL)
    # shrinking 16 -> 12: the 12 that stay receive 4 shards over 12 GPUs
    assert reshard_s(c, lay, 16, 12, local=False) == pytest.approx(state16 * 4 / 12 / 50e9, **REL)
    state8 = 32.5e9 / 4 * (2 + 4) + 32.5e9 * 12 / 8
    assert reshard_s(c, lay, 0, 8, local=False) == pytest.approx(state8 / 55e9, **REL)
    assert reshard_s(CostModel(), NO_FLOOR, 8, 16, local=False) == 0.0


# ------------------------------------------------------------------------ MoE
def test_moe_parameters_and_decode_by_hand() -> None:
    c = MOE
    e = (30.5e9 - 3.3e9) / (1 - 8 / 128)
    assert c.expert_params == pytest.approx(e, **REL)
    assert c.active_params == pytest.approx(3.3e9, rel=1e-12)
    # a batch of 16 tokens touches 1 - (120/128)^16 of the experts (uniform routing)
    touched = 1 - (1 - 8 / 128) ** 16
    read = (30.5e9 - e) * 2 + e * 2 * touched + 2 * 48 * 4 * 128 * 2 * 5e4
    mem = read / (4 * 3.35e12 * 0.6)
    comp = 2 * 3.3e9 * 16 / (4 * 989e12 * 0.5)
    assert c.decode_step_s(4, 16, 5e4) == pytest.approx(0.004 + max(mem, comp), rel=1e-9)
    # a batch of one reads 1/16 of the experts; a big batch nearly all of them
    one = c.decode_coefficients(4).mem_s(1, 0.0) * 4 * 3.35e12 * 0.6
    assert one == pytest.approx((30.5e9 - e) * 2 + e * 2 * 8 / 128, **REL)
    # training and prefill FLOPs come from active parameters (state from total: below)
    assert c.train_flops(1000.0) == pytest.approx(6 * 3.3e9 * 1000 + 6 * 48 * 4096 * 1000**2, **REL)
    assert c.prefill_s(4, 100.0, 0.0) == pytest.approx(
        (2 * 3.3e9 * 100 + 4 * 48 * 4096 * 100 * 50) / (4 * 989e12 * 0.5), **REL)


def test_moe_memory_floor_by_hand() -> None:
    lay = train_layout(MOE)
    assert (lay.tp, lay.pp, lay.cp, lay.min_dp) == (2, 1, 1, 8)
    e = MOE.expert_params
    dense = 30.5e9 - e
    ep = 16  # the largest power of two dividing 128 experts within 16 ranks
    m = lay.memory
    assert m.weights == pytest.approx((dense / 2 + e / ep) * 2, **REL)
    assert m.grads == pytest.approx((dense / 2 + e / ep) * 4, **REL)
    assert m.optimizer == pytest.approx(dense / 2 * 12 / 8 + e / ep * 12 / 1, **REL)
    assert m.activations == pytest.approx(131072 / 2 * 2048 * (2 * 48 + 34), **REL)
    assert m.fits and not train_memory(MOE, 2, 1, 1, 4).fits


def test_expert_parallel_engine_across_domains_pays_all_to_all() -> None:
    c = preset_cost("kimi-k2", "h200")
    assert min_engine_gpus(c) == 16  # 1.04 TB of FP8 weights: two 8-GPU domains
    inside = c.decode_coefficients(16, spans_nodes=False)
    across = c.decode_coefficients(16, spans_nodes=True)
    assert across.overhead == pytest.approx(c.decode_overhead_s + 2 * 61 * 20e-6, **REL)
    assert across.per_seq == pytest.approx(2 * 61 * 8 * 7168 * 1.0 / (16 * 50e9), **REL)
    assert across.step_s(64, 1e6) > inside.step_s(64, 1e6)
    assert c.spans_nodes(0, 16) and not c.spans_nodes(8, 8)


# ------------------------------------------------------------------------ engine
@pytest.mark.parametrize("cost", [CostModel(), DENSE, MOE], ids=["default", "dense", "moe"])
def test_engine_rate_is_the_cost_models_decode_step(cost: CostModel) -> None:
    eng = EngineSim(0, 0, 4, cost, cost.kv_capacity_tokens(4))
    co = cost.decode_coefficients(4)
    eng.join(0.0, "a", 5000, 0, 10.0)
    assert eng.rate == 1.0 / co.step_s(1, 5000.0)
    eng.join(0.0, "b", 7000, 0, 10.0)
    assert eng.rate == 1.0 / co.step_s(2, 12000.0)


# ------------------------------------------------------------------------ presets
@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("gpu", list(GPUS))
def test_every_preset_loads_and_has_a_floor(model: str, gpu: str) -> None:
    c = preset_cost(model, gpu)
    lay = train_layout(c)
    assert lay.min_gpus >= 1 and lay.min_gpus % lay.unit == 0 and lay.memory.fits
    assert c.kv_capacity_tokens(min_engine_gpus(c)) >= 1
    assert MODELS[model].source and GPUS[gpu].source


def test_preset_selection_and_errors() -> None:
    c = resolve_cost(None, None, None, {"model": "qwen2.5-7b", "gpu": "b200", "switch_s": 3.0})
    assert c.params == 7.61e9 and c.hbm_bytes == 180e9 and c.switch_s == 3.0
    assert resolve_cost("qwen2.5-72b", None, None, {"model": "qwen2.5-7b"}).params == 72.7e9  # flag wins
    # the default is the Qwen2.5-32B / H200 preset (the flat defaults' own shape and GPU)
    assert resolve_cost(None, None, None, {}) == preset_cost("qwen2.5-32b", "h200")
    assert train_layout(resolve_cost(None, None, None, {})).min_gpus == 8
    # "none" is the flat historic model, from a flag or [cost]; a cost field still applies
    assert resolve_cost("none", None, None, {}) == CostModel()
    assert resolve_cost(None, "None", None, {}) == CostModel()
    assert resolve_cost(None, None, None, {"model": "none", "switch_s": 3.0}) == CostModel(switch_s=3.0)
    assert train_layout(resolve_cost("none", None, None, {})).min_gpus == 1
    with pytest.raises(ConfigError, match=r"'none' is the flat historic cost model.*drop 'h100'"):
        resolve_cost("none", "h100", None, {})
    with pytest.raises(ConfigError, match=r"unknown model preset 'qwen2.5-33b' \(did you mean qwen2.5-32b\?\)"):
        preset_cost("qwen2.5-33b", "h200")
    with pytest.raises(ConfigError, match="expected a preset name"):
        resolve_cost(None, None, None, {"gpu": 3})
    with pytest.raises(ConfigError, match="no trainer"):
        train_layout(preset_cost("ref-2.4t", "h100").with_overrides({"train_seq_tokens": 1e9}))


# ------------------------------------------------------------------------ legality
def _state(train: int, floor: int = 8) -> ClusterState:
    st = ClusterState(16, 4, [[("r0", "t0")]], 0)
    st.roles.assign(tuple(range(train)), Role.TRAIN)
    st.set_trainer_floor(floor, 4, why="hand floor")
    return st


def test_reassign_below_the_floor_is_refused() -> None:
    st = _state(12)
    with pytest.raises(PolicyError, match=r"leaves the trainer 4 GPUs, below its floor of 8 \(hand floor\)"):
        legality_check(st, Reassign(tuple(range(8)), Role.ROLLOUT))
    legality_check(st, Reassign(tuple(range(4)), Role.ROLLOUT))  # leaves 8: fine
    legality_check(st, Reassign(tuple(range(12)), Role.ROLLOUT))  # leaves none: fine
    legality_check(st, Reassign((12, 13, 14, 15), Role.TRAIN))  # growing is never refused
    info = st.trainer()
    assert (info.min_gpus, info.grow_unit) == (8, 4)
    assert ClusterState(16, 4, [[("r0", "t0")]], 0).trainer().min_gpus == 1  # default: no floor
    assert st.gpus_per_node == 0  # flat unless a driver with a topology says otherwise


def test_gpus_already_leaving_the_trainer_count_as_gone() -> None:
    # 8 trainer GPUs; an earlier Reassign sent 4..7 away while a job ran (still TRAIN until
    # it ends): sending 0..3 away too empties the trainer -- legal; sending 0..1 leaves 2
    st = _state(8)
    for g in range(4, 8):
        st.leaving_train[g] = (1, Role.ROLLOUT)
    legality_check(st, Reassign((0, 1, 2, 3), Role.IDLE))
    with pytest.raises(PolicyError, match=r"leaves the trainer 2 GPUs, below its floor of 8"):
        legality_check(st, Reassign((0, 1), Role.IDLE))


def test_simulator_refuses_a_policy_that_shrinks_below_the_floor() -> None:
    from rlsched.cluster.config import RunConfig
    from rlsched.cluster.events import RolesChanged, RunStarted
    from rlsched.sim.driver import SimDriver
    from rlsched.sim.workload import Workload

    from simkit import trace

    class ShrinkBelowFloor:
        """A scripted (fake) policy: all GPUs train, then half of the trainer leaves."""

        name = "shrink"
        max_staleness = 0
        defers = False

        def reset(self, view, rng) -> None:
            self.moved = False

        def on_event(self, event, view):
            if isinstance(event, RunStarted):
                return [Reassign(tuple(range(view.num_gpus)), Role.TRAIN)]
            if isinstance(event, RolesChanged) and not self.moved:
                self.moved = True
                return [Reassign(tuple(range(12)), Role.ROLLOUT)]
            return []

    w = Workload.from_frame(trace([("t", "a", 0, 10, 3, 0.0)]))
    with pytest.raises(PolicyError, match=r"below its floor of 8 \(tp=4 pp=1 cp=1 x dp=2"):
        SimDriver(w, [[("a", "a")]], ShrinkBelowFloor(), RunConfig(gpus=16, tp=4, steps=1), DENSE).run()


def test_no_policy_beats_the_bound_with_the_floor(tmp_path) -> None:
    from rlsched.cluster.config import RunConfig
    from rlsched.compare import ComparePlan, compare
    from rlsched.traces import sample_trace_path

    cost = preset_cost("qwen2.5-72b", "h100")  # floor 32 of 64 GPUs: it binds
    assert train_layout(cost).min_gpus == 32
    pols = ("colocated", "async", "elastic", "partial", "elastic:staleness=1")
    plan = ComparePlan(sample_trace_path(), pols, RunConfig(gpus=64, tp=4, steps=2), cost)
    s = compare(plan, tmp_path / "o", report=False)
    assert len(s) == len(pols) and (s["steps"] == 2).all()
    for _, row in s.iterrows():
        assert row["sim_seconds"] >= row["lower_bound_seconds"] * (1 - 1e-9), row["policy"]
    assert math.isfinite(float(s["lower_bound_seconds"].min()))


def test_async_split_keeps_the_trainer_at_its_floor() -> None:
    from rlsched.policies.common import engine_split

    st = ClusterState(64, 4, [[("r0", "t0")]], 0)
    rollout, train = engine_split(st, 0.75)
    assert (len(rollout), len(train)) == (48, 16)  # no floor: the fraction as asked
    st.set_trainer_floor(32, 32)
    rollout, train = engine_split(st, 0.75)
    assert (len(rollout), len(train)) == (32, 32)
    rollout, train = engine_split(st, 0.25)
    assert (len(rollout), len(train)) == (16, 48)  # above the floor: unchanged


@pytest.mark.parametrize("spec", ["colocated", "async", "elastic", "partial", "elastic:staleness=1"])
def test_every_policy_runs_on_a_trillion_parameter_moe(spec: str, tmp_path) -> None:
    """Kimi K2 on H200: 16-GPU expert-parallel engines across two domains, a 256-GPU floor."""
    from rlsched.cluster.config import RunConfig
    from rlsched.compare import ComparePlan, compare
    from rlsched.traces import sample_trace_path

    cost = preset_cost("kimi-k2", "h200")
    assert train_layout(cost).min_gpus == 256
    plan = ComparePlan(sample_trace_path(), (spec,), RunConfig(gpus=1024, tp=16, steps=1), cost)
    s = compare(plan, tmp_path / "o", report=False)
    from rlsched.sim.driver import SimDriver  # the view tells policies the node size
    from rlsched.sim.workload import Workload

    from simkit import trace

    w = Workload.from_frame(trace([("t", "a", 0, 10, 3, 0.0)]))
    from rlsched.policies import make_policy

    d = SimDriver(w, [[("a", "a")]], make_policy(spec), RunConfig(gpus=1024, tp=16, steps=1), cost)
    assert d.state.gpus_per_node == 8 and d.state.trainer().min_gpus == 256
    assert int(s["steps"].iloc[0]) == 1
    assert float(s["sim_seconds"].iloc[0]) >= float(s["lower_bound_seconds"].iloc[0])


def test_a_plans_cost_table_reloads_as_the_same_model() -> None:
    # recommended.toml's [cost] holds what differs from the default preset; loaded over the
    # default again it is the planned model -- the flat one (--model none) included
    from rlsched.plan.output import cost_overrides

    for c in (CostModel(), preset_cost("qwen2.5-32b", "h200"), preset_cost("qwen3-30b-a3b", "b200"),
              CostModel(switch_s=3.0)):
        assert resolve_cost(None, None, None, dict(cost_overrides(c))) == c
    assert cost_overrides(preset_cost("qwen2.5-32b", "h200")) == {}
