"""``cluster.loop.assembly``: the rule both drivers follow for when an engine of tp > 1
opens -- when its last GPU lands in rollout -- tested on a bare ``ClusterState``."""

from __future__ import annotations

from rlsched.cluster.ids import Role
from rlsched.cluster.loop.assembly import Assembly, Formed
from rlsched.cluster.state import ClusterState


def _state(**roles: Role) -> ClusterState:
    """8 GPUs in engines of 2; ``g3=Role.TRAIN`` sets GPU 3's role (the rest IDLE)."""
    st = ClusterState(8, 2, [[("a", "t")]], 0)
    for name, role in roles.items():
        st.set_roles((int(name[1:]),), role)
    return st


def _to(targets: dict[int, Role]):
    return targets.get


def test_an_engine_whose_gpus_land_together_opens_at_once() -> None:
    st = _state(g2=Role.SWITCHING, g3=Role.SWITCHING)
    a = Assembly()
    assert a.land(st, (2, 3), 7, 1, _to({2: Role.ROLLOUT, 3: Role.ROLLOUT})) == [
        Formed(1, True, (((2, 3), 7, 1),))]
    assert not a.waiting


def test_a_gpu_waits_for_its_partner_then_the_engine_opens_with_the_newest_weights() -> None:
    st = _state(g2=Role.SWITCHING, g3=Role.SWITCHING)
    a = Assembly()
    # 3 (group 5, weights 1) lands while 2 (group 6) still switches to rollout
    assert a.land(st, (3,), 5, 1, _to({2: Role.ROLLOUT, 3: Role.ROLLOUT})) == []
    assert a.waiting == {1: [((3,), 5, 1)]}
    formed = a.land(st, (2,), 6, 2, _to({2: Role.ROLLOUT, 3: Role.ROLLOUT}))
    assert formed == [Formed(1, True, (((2,), 6, 2), ((3,), 5, 1)))]
    assert formed[0].version == 2 and not a.waiting


def test_a_gpu_waits_for_a_partner_that_leaves_the_trainer_after_its_job() -> None:
    st = _state(g2=Role.TRAIN, g3=Role.SWITCHING)
    st.leave_train_later(2, 5, Role.ROLLOUT)
    a = Assembly()
    assert a.land(st, (3,), 5, 0, _to({3: Role.ROLLOUT})) == []
    assert a.waiting == {1: [((3,), 5, 0)]}


def test_a_gpu_whose_partner_is_not_coming_cannot_form_its_engine() -> None:
    # the partner trains and stays; or it leaves the trainer for another role; or it
    # switches to the trainer
    for roles, leaving, targets in (
        ({"g2": Role.TRAIN}, None, {}),
        ({"g2": Role.TRAIN}, Role.IDLE, {}),
        ({"g2": Role.SWITCHING}, None, {2: Role.TRAIN}),
        ({}, None, {}),  # idle (after a failure)
    ):
        st = _state(g3=Role.SWITCHING, **roles)
        if leaving is not None:
            st.leave_train_later(2, 4, leaving)
        a = Assembly()
        assert a.land(st, (3,), 5, 0, _to({3: Role.ROLLOUT, **targets})) == [
            Formed(1, False, (((3,), 5, 0),))]


def test_a_waiting_part_is_released_when_its_partner_is_lost() -> None:
    st = _state(g4=Role.SWITCHING, g5=Role.SWITCHING, g2=Role.SWITCHING, g3=Role.SWITCHING)
    targets = _to({2: Role.ROLLOUT, 3: Role.ROLLOUT, 4: Role.ROLLOUT, 5: Role.ROLLOUT})
    a = Assembly()
    assert a.land(st, (3, 5), 5, 0, targets) == []
    assert a.lost(st, 2) == (((3,), 5, 0),)  # engine 1's waiting part goes idle
    assert a.waiting == {2: [((5,), 5, 0)]}  # engine 2's still waits for 4
    assert a.lost(st, 5) == ()  # a waiting GPU that failed itself: nothing else waited
    assert a.lost(st, 0) == ()
