"""``elastic``: move GPUs between rollout and training as the load shifts.

A reconciliation loop: on every event the policy compares what the cluster does with
what it should do, and issues only the difference. What it should do:

* **Roll out what the weights allow, spread out, longest first.** Batch s may roll out
  once engines hold weights s-k (``staleness`` k). Its trajectories wait in the policy's
  own queue (:class:`~rlsched.policies.placement.LateQueue`) and are placed one by one on
  the least loaded engine with room (``pack``), the longest predicted first
  (:mod:`~rlsched.policies.predict`: the group's finished siblings and the trajectory's
  own progress; nothing about the future). An engine that empties takes queued work.
* **Train what has finished, as it finishes.** The trainer streams micro-batches of the
  step it is on at its current width; the optimizer step follows the step's last one,
  so with k=0 it is the step colocated would take, on the same trajectories.
* **Give the trainer the GPUs rollout no longer needs, and only when it has work.** An
  engine goes to training when the trainer has finished work waiting and the live
  trajectories fit on the other engines without crowding them (``kv_limit``: decode on
  an engine slows with every token of KV it holds, so the tail is never packed).
* **Take GPUs back when a batch needs them.** When a new batch is released the engines
  it needs for its spread come back from the trainer (as soon as its micro-batch ends);
  with a backlog to train the trainer keeps enough GPUs to train it within
  ``train_within`` of the last batch's rollout time (measured). With staleness k >= 1 a
  trainer of ``train_share`` of the GPUs starts beside the rollout, as async's split does;
  an empty trainer (``train_share=0``) that no freed engine reaches (a flat tail) gets
  one anyway once as much has finished as still runs (``hedge``). ``train_share=0`` and a
  shorter ``train_within`` (0.4: with staleness k the end of step s releases batch
  s+k+1, so the trainer's backlog is on that chain) were 2-11% faster at five of the
  elastic bench's six k=1 points but up to 23% slower on the regime map's long-sequence,
  training-heavy points, so they are not the defaults.

* **Hold a fixed split when moves cannot pay** (``hold``, staleness k >= 1): moving GPUs to
  the trainer and back costs two role switches and saves at most part of a step's
  training. Once a step's training, measured (its tokens at the measured GPU-seconds per
  token), takes no longer on half the GPUs than those two switches (measured), elastic
  holds a fixed split of half the engines in each role (the flat middle of async's sweep)
  until a heavier step lifts it. Small clusters with few trajectories a step live here:
  it closed the three no-harm counterexamples (2.3 / 1.0 / 2.0% behind the best async, now
  1.0% behind / 2.8% / 0.2% ahead); it engaged at no point of the elastic bench (64 and 256
  GPUs) nor the regime map.
* **A micro-batch waits for GPUs on their way** (``join``): a micro-batch runs on the GPUs
  the trainer has when it starts, so when a trajectory (typically the step's last, the
  longest) would finish sooner on the trainer after the engines switching to it arrive,
  at the measured rate and switch time, by more than half a switch, it waits for them.

* **Spread the tail that is left** (``steal``): an engine kept in rollout with nothing to
  do takes (``Move``) the trajectory predicted longest off an engine crowded with three
  or more, instead of idling beside it; the driver charges the KV transfer.
* **Isolate the tail** (``isolate``, on by default): once a step is down to its tail (at
  most two unfinished trajectories per rollout engine), its live trajectories, predicted
  longest first, each move once to the engine with the fewest live trajectories when
  they would share it with fewer than their own: decode on an engine slows with every
  sequence and KV token it holds, and with staleness a step's longest trajectory shares
  its engine with two batches' bulk. Measured against ``isolate=false`` (simulated, the
  elastic bench's six points and the regime map's twelve): at k=1 faster at five bench
  points (by up to 11% on the growing preset), slower by 0.3% at the sixth and by at most
  0.01% on the map; at k=0 faster at all six bench points (0.03-1.2%). It costs 0.7 points
  on one small no-harm case (4 engines, 8 trajectories a step: 2.3% behind the best async
  instead of 1.6%); ``isolate=false`` gives the earlier schedule.
* **Cut the tail, if asked** (``cut``, staleness k >= 1 only): the step's optimizer step
  need not wait for its last few trajectories; they are trained with the next step (and
  batches are released one version later, so that stays within k).

With k=0 this is colocated's schedule plus training that starts in the tail; with k >= 1
batch s+1 is released the moment weights s+1-k exist and its rollout overlaps the
training of batch s.
"""

from .config import ElasticConfig
from .policy import Elastic

__all__ = ["Elastic", "ElasticConfig"]
