"""KV migration is costed by where the two engines' GPUs are: NVLink when the source and
destination engine share a domain, the NICs across domains (as weight sync already is),
against hand calculations on a scripted timeline."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_move import MOVE_COST, ONE, Scripted, _opened, _run

from rlsched.cluster.commands import Dispatch, Move, SetTimer
from rlsched.cluster.events import TimerFired

from simkit import APPROX

# Two GPUs per NVLink domain (GPUs 0-1: domain 0, 2-3: domain 1). KV is 2 bytes per token;
# NVLink 4 B/s and a 2.6 B/s NIC per GPU; re-prefilling costs 1 s per token.
TOPO = replace(MOVE_COST, gpus_per_node=2, nvlink_bw=4.0, fabric_bw=2.6)


def _moved_to(dest: int) -> Scripted:
    def script(ev, v):
        if _opened(ev):
            return [Dispatch(("A",), 0), SetTimer(14.5, "move")]
        if isinstance(ev, TimerFired):
            return [Move(("A",), dest)]
        return []

    return Scripted(script)


@pytest.mark.parametrize(("dest", "seconds"), [
    (1, 13 * 2 / 4.0),  # same domain: 26 bytes over NVLink at 4 B/s = 6.5 s
    (2, 13 * 2 / 2.6),  # across domains: 26 bytes over the NIC at 2.6 B/s = 10 s (< 13 s re-prefill)
])
def test_a_move_is_charged_by_where_the_engines_are(dest: int, seconds: float) -> None:
    # A alone on engine 0: switch 1 s, prefill 10 s, decode 1 s/step; moved at 14.5 with
    # 13 tokens of context (10 prompt + 3 generated); 7 steps left after its KV arrives
    pol = _moved_to(dest)
    out = _run(ONE, ["A"], pol, gpus=4, cost=TOPO)
    assert pol.finished["A"] == pytest.approx(14.5 + seconds + 7, **APPROX)
    ts = out.result.state.trajs["A"]
    assert ts.engine == dest and ts.migrations == 1


def test_a_cross_domain_move_slower_than_a_reprefill_reprefills() -> None:
    # the NIC at 1 B/s: 26 s of transfer > 13 s of re-prefilling 13 tokens
    slow = replace(TOPO, fabric_bw=1.0)
    assert slow.migrate_s(1, 13, local=False) == pytest.approx((13.0, True))
    assert slow.migrate_s(1, 13, local=True) == pytest.approx((6.5, False))
    pol = _moved_to(2)
    _run(ONE, ["A"], pol, gpus=4, cost=slow)
    assert pol.finished["A"] == pytest.approx(14.5 + 13 + 7, **APPROX)


def test_without_a_topology_every_move_pays_the_flat_transfer() -> None:
    # flat fabric (gpus_per_node 0): kv_transfer_bw 4 B/s wherever the engines are
    for dest in (1, 2):
        pol = _moved_to(dest)
        _run(ONE, ["A"], pol, gpus=4, cost=MOVE_COST)
        assert pol.finished["A"] == pytest.approx(14.5 + 6.5 + 7, **APPROX)


def test_cost_show_prints_the_migration_both_ways() -> None:
    from rlsched.cli.cost import describe
    from rlsched.sim.presets import preset_cost

    # Qwen2.5-32B KV: 2 x 64 layers x 8 heads x 128 x 2 bytes = 262,144 B per token; a
    # 32,768-token context is 8.59 GB, over 4 shards: 4 x 450 GB/s NVLink -> 4.8 ms, 4 x 50
    # GB/s NICs -> 42.9 ms
    kv = 2 * 64 * 8 * 128 * 2 * 32768
    assert kv / (4 * 450e9) * 1e3 == pytest.approx(4.77, abs=0.01)
    line = next(s for s in describe(preset_cost("qwen2.5-32b", "h200"), 4) if s.startswith("migrate"))
    assert "4.8 ms (KV transfer) within a domain, 42.9 ms (KV transfer) across domains" in line
