"""``oracle``: the elastic policy with the trace's true lengths -- an upper reference only.

Every other policy decides from what a real scheduler could know. This one is handed
each trajectory's true number of turns by whoever builds it (a bench that read the
trace), and places the longest first by those instead of by
:class:`~rlsched.policies.predict.LengthPredictor`'s estimate. The distance between
``elastic`` and ``oracle`` is what better length prediction could still buy; nothing a
cluster can run gets the oracle's figures.

It is not in the policy registry (``rlsched compare``/``plan`` cannot build it: they do
not hand a policy the trace's future); build it with :meth:`Oracle.from_lengths`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from rlsched.cluster.errors import PolicyError
from rlsched.cluster.ids import TrajectoryId

from .elastic import Elastic
from .predict import OracleLengths


class Oracle(Elastic):
    name: ClassVar[str] = "oracle"

    def __init__(self, total_turns: Mapping[TrajectoryId, int] | None = None, **params: Any) -> None:
        if total_turns is None:
            raise PolicyError("oracle: it needs every trajectory's true number of turns "
                              "(Oracle.from_lengths); it is a reference for benches, not a policy to run")
        self._total = dict(total_turns)  # (before elastic's constructor, whichever its style)
        super().__init__(**params)

    @classmethod
    def from_lengths(cls, total_turns: Mapping[TrajectoryId, int], **params: Any) -> Oracle:
        """The oracle over ``total_turns`` (run id -> turns), with elastic's ``params``."""
        return cls(total_turns, **params)

    def _lengths(self) -> OracleLengths:  # type: ignore[override]
        return OracleLengths(self._total)
