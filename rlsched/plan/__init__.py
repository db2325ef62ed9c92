"""``rlsched plan``: search every policy's parameters on the simulator, check the winners
for robustness and sensitivity, and write a recommended config.

Modules, in the order a plan runs them: :mod:`.space` (the search space the policies'
declared parameters span), :mod:`.evaluation` (one simulation of one configuration on one
trace variant, locally or on Ray), :mod:`.search` (TPE with successive halving),
:mod:`.checks` (robustness and sensitivity), :mod:`.output` (the files) and
:mod:`.planner` (the four phases under one budget); :mod:`.request` holds the request and
result records. The trace variants it evaluates on are :mod:`rlsched.traces.variants`.
"""

from rlsched.plan.planner import plan, resolve_run
from rlsched.plan.request import PlanRequest, PlanResult

__all__ = ["PlanRequest", "PlanResult", "plan", "resolve_run"]
