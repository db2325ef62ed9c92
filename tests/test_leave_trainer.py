"""``policies.common.leave_trainer``: the order of the Reassigns that take GPUs out of the
trainer (whole engines to rollout, the rest idle), without a driver, on a real
ClusterState. The contract's checker is the oracle here, never the policy's: every command
is legal in turn (the state changed between them as a driver changes it), and whole
engines go first exactly when the contract allows it (the order elastic always used)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.cluster.commands import Reassign
from rlsched.cluster.errors import PolicyError
from rlsched.cluster.ids import Role
from rlsched.cluster.legality import check as legality_check
from rlsched.cluster.state import ClusterState
from rlsched.policies.common import back_to_rollout, leave_trainer


def _state(num_gpus: int, tp: int, roles: dict[int, Role], floor: int,
           leaving: tuple[int, ...] = (), failed: tuple[int, ...] = ()) -> ClusterState:
    """GPUs not named in ``roles`` are idle; ``leaving`` trainer GPUs were sent away while a
    micro-batch runs (role TRAIN until it ends); ``failed`` ones are down."""
    s = ClusterState(num_gpus, tp, [[("A", "t")]], max_staleness=0)
    for g, r in roles.items():
        s.roles.assign((g,), r)
    s.set_trainer_floor(floor, tp, why="test floor")
    for g in leaving:
        s.leave_train_later(g, 0, Role.IDLE)
    for g in failed:
        s.mark_failed(g)
    return s


def _plan(s: ClusterState, gpus: tuple[int, ...]) -> list[tuple[tuple[int, ...], Role]]:
    return [(c.gpus, c.role) for c in leave_trainer(s, gpus)]


def _apply(s: ClusterState, cmd: Reassign, busy: bool) -> None:
    """As the simulator's driver applies a Reassign away from the trainer: trainer GPUs
    wait for a running job (``busy``) or switch now; idle ones switch now."""
    for g in cmd.gpus:
        if s.role(g) is Role.TRAIN and busy:
            s.leave_train_later(g, 1, cmd.role)
        else:
            s.set_roles((g,), Role.SWITCHING)


def _legal(s: ClusterState, cmd: Reassign) -> bool:
    try:
        legality_check(s, cmd)
    except PolicyError:
        return False
    return True


T = Role.TRAIN


def test_one_kind_is_one_reassign():
    s = _state(8, 2, dict.fromkeys(range(2, 8), T), floor=4)
    assert _plan(s, (4, 5, 6, 7)) == [((4, 5, 6, 7), Role.ROLLOUT)]
    s = _state(8, 2, {**dict.fromkeys(range(2, 7), T), 7: Role.SWITCHING}, floor=1)
    assert _plan(s, (6,)) == [((6,), Role.IDLE)]  # (its partner is elsewhere: not whole)


def test_whole_engines_first_when_what_stays_is_at_the_floor():
    # engine (6, 7) is whole; 5's partner 4 stays in the trainer: 2, 3, 4 and 5 stay after
    # the first command, at the floor of 4
    s = _state(8, 2, dict.fromkeys(range(2, 8), T), floor=4)
    assert _plan(s, (5, 6, 7)) == [((6, 7), Role.ROLLOUT), ((5,), Role.IDLE)]


def test_the_odd_gpus_first_when_rolling_out_first_would_strand_one_that_could_follow():
    # 4 engines of 2 GPUs; the trainer holds 2-5 and 5 already leaves it: engine (2, 3)
    # rolls out, 4 goes idle. Whole engines first would leave 4 alone, below a floor of 2,
    # though its engine (4 in the trainer, 5 leaving it) could have gone along: the odd GPU
    # goes first, leaving (2, 3) at the floor
    s = _state(8, 2, dict.fromkeys((2, 3, 4, 5), T), floor=2, leaving=(5,))
    assert _plan(s, (2, 3, 4)) == [((4,), Role.IDLE), ((2, 3), Role.ROLLOUT)]
    # a floor of 4: either order leaves it below: every GPU it holds goes idle at once
    s = _state(8, 2, dict.fromkeys((2, 3, 4, 5), T), floor=4, leaving=(5,))
    assert _plan(s, (2, 3, 4)) == [((2, 3, 4), Role.IDLE)]
    # 5 failed instead: 4 could not have gone along (a failure strands it): whole engines first
    s = _state(8, 2, dict.fromkeys((2, 3, 4), T), floor=2, failed=(5,))
    assert _plan(s, (2, 3, 4)) == [((2, 3), Role.ROLLOUT), ((4,), Role.IDLE)]


def test_an_idle_partner_back_from_a_failure_rolls_out_with_its_engine():
    s = _state(8, 2, dict.fromkeys((2, 3, 4, 6), T), floor=1, failed=(7,))
    assert _plan(s, (2, 3, 4, 6)) == [((2, 3, 4, 5), Role.ROLLOUT), ((6,), Role.IDLE)]


@st.composite
def _cases(draw):
    """A trainer after failures: engines whole in rollout, GPUs in the trainer, idle,
    switching or failed, some trainer GPUs already leaving; ``gpus`` a set of the others
    that leaves the trainer empty or at its floor (as elastic's ``_reclaim`` sizes it)."""
    tp = draw(st.integers(1, 3))
    engines = draw(st.integers(2, 5))
    n = tp * engines
    roles: dict[int, Role] = {}
    for e in range(engines):
        if draw(st.booleans()) and draw(st.booleans()):
            roles.update(dict.fromkeys(range(e * tp, (e + 1) * tp), Role.ROLLOUT))
            continue
        for g in range(e * tp, (e + 1) * tp):
            roles[g] = draw(st.sampled_from((T, T, T, Role.IDLE, Role.SWITCHING)))
    trainer = [g for g, r in roles.items() if r is T]
    idle = [g for g, r in roles.items() if r is Role.IDLE]
    leaving = tuple(g for g in trainer if draw(st.integers(0, 3)) == 0)
    failed = tuple(g for g in idle if draw(st.booleans()))
    free = [g for g in trainer if g not in leaving]
    gpus = tuple(g for g in free if draw(st.booleans()))
    floor = draw(st.integers(1, n))
    if not gpus or 0 < len(free) - len(gpus) < floor:
        gpus = tuple(free)
    busy = draw(st.booleans())
    return _state(n, tp, roles, floor, leaving, failed), gpus, busy


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_every_command_is_legal_in_turn_and_whole_engines_go_first_when_allowed(case):
    s, gpus, busy = case
    if not gpus:
        assert leave_trainer(s, gpus) == ()
        return
    cmds = leave_trainer(s, gpus)
    rollout = [c for c in cmds if c.role is Role.ROLLOUT]
    # every GPU asked for leaves the trainer; whole engines (with idle working partners)
    # roll out
    assert sorted(g for c in cmds for g in c.gpus if s.role(g) is T) == sorted(gpus)
    for c in rollout:
        assert {g for e in {s.engine_of(g) for g in c.gpus} for g in s.engine_gpus(e)} == set(c.gpus)
    whole, odd = back_to_rollout(s, gpus)
    if whole and odd:  # both kinds: whole engines first whenever the contract allows it
        if _legal(s, Reassign(whole, Role.ROLLOUT)):
            assert cmds == (Reassign(whole, Role.ROLLOUT), Reassign(odd, Role.IDLE))
        elif _legal(s, Reassign(odd, Role.IDLE)):
            assert cmds == (Reassign(odd, Role.IDLE), Reassign(whole, Role.ROLLOUT))
        else:
            assert cmds == (Reassign(tuple(sorted(gpus)), Role.IDLE),)
    for c in cmds:
        legality_check(s, c)  # (the contract's check, as the driver makes it before applying)
        _apply(s, c, busy)
