"""The load spreads elastic's tail (``steal``, ``isolate``) keeps per tuple of the view's
engine loads answer as a pass over the engines would, with and without the engines that
leave rollout in the decision."""

from hypothesis import given
from hypothesis import strategies as st

from rlsched.policies.elastic.tail import TailSpreader, _loads_of
from rlsched.policies.predict import LengthPredictor


@st.composite
def _loads(draw):
    ids = sorted(draw(st.sets(st.integers(0, 40), max_size=12)))
    loads = tuple((e, draw(st.integers(0, 6))) for e in ids)
    gone = draw(st.sets(st.integers(0, 45), max_size=4))
    return loads, gone


@given(_loads())
def test_the_kept_spreads_are_those_of_a_pass_over_the_engines(case):
    loads, gone = case
    tail = TailSpreader(LengthPredictor())
    ls = [load for _, load in loads]
    for _ in range(2):  # (the second ask is answered from what was kept)
        assert tail._spread(loads) == (min(ls, default=0), max(ls, default=0))
        left = [load for e, load in loads if e not in gone]
        assert _loads_of(loads, gone) == {e: load for e, load in loads if e in gone}
        assert tail._spread_without(loads, _loads_of(loads, gone)) == (
            len(left), min(left, default=0), max(left, default=0))
    other = tuple((e, load + 1) for e, load in loads)  # (a new tuple: asked afresh)
    assert tail._spread(other) == (min(ls, default=0) + 1 if ls else 0, max(ls, default=-1) + 1)
