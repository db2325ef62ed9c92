"""rlsched.real: the live backend -- the same policies on Ray, vLLM engines, a Megatron-core
trainer and sandboxed environments. Heavy libraries are imported only inside the modules
that need them; ``rlsched.real.run`` raises one LiveBackendError line without the [live]
extra.

One sub-package per role, so the tree shows the architecture:

``run``        composition of one live run: placement, engines, trainer, loop, run record
``config``     the ``[live]`` settings of a run config
``loop/``      the live backend of the driver loop: rollout, role changes, training and
               weight sync on real workers, fault injection, Ray placement, checkpoints
``rollout/``   the vLLM engine actor and the agent loop (model output -> tool calls)
``train/``     Megatron-core workers, the trainer lane, GRPO and the policy-gradient loss,
               weights publishing, warm start
``envs/``      agent environments (coding, lookup), graders and the tool sandbox
``record/``    what a live run writes: run-record tables, recorder, dashboards
``calibrate/`` measure the live stack and fit the simulator's cost model
``model/``     the tiny locally built model and checkpoint conversion
"""
