"""``elastic``: move GPUs between rollout and training as the load shifts.

A reconciliation loop: on every event the policy compares what the cluster does with
what it should do, and issues only the difference. What it should do, and where each
part lives:

* **Roll out what the weights allow, spread out, longest first; give the trainer the GPUs
  rollout no longer needs, and only when it has work** -- the loop itself (:mod:`.policy`,
  class :class:`Elastic`).
* **Take GPUs back when a batch needs them**, when that pays for the switches --
  :mod:`.reclaim`.
* **Train what has finished, as it finishes** (a step whose rollout is over in one
  micro-batch while nothing rolls out), and let a micro-batch wait for GPUs on their way
  (``join``) -- :mod:`.training` -- or, if asked, for the end of the instant its
  trajectory finished in (``settle``) -- :mod:`.policy`.
* **Reserve a trainer beside the rollout** (``train_share``) and **hold a fixed split when
  moves cannot pay** (``hold``) -- :mod:`.hold`.
* **Spread the tail that is left** (``steal``), **isolate the tail** (``isolate``) and
  **move queued work off KV-full engines** (``rebalance``) -- :mod:`.tail`.
* **Cut the tail, if asked** (``cut``) -- :mod:`.cut`.

The role switches the policy has sent and not yet seen end are kept in :mod:`.switches`;
the parameters, a public contract, in :mod:`.config`. Each module's docstring gives its
mechanisms and what was measured for them.

With k=0 this is colocated's schedule plus training that starts in the tail; with k >= 1
batch s+1 is released the moment weights s+1-k exist and its rollout overlaps the
training of batch s.
"""

from .config import ElasticConfig
from .policy import Elastic

__all__ = ["Elastic", "ElasticConfig"]
