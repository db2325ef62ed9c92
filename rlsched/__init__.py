"""rlsched: keep GPUs busy in agent RL.

The top-level folders of the repository are subpackages of this one (``rlsched.cluster``,
``rlsched.policies``, ``rlsched.traces``, ``rlsched.sim``, ``rlsched.real``,
``rlsched.analysis``); this package itself is the composition root: the command line
(``rlsched.cli``, one module per verb), the planner (``rlsched.plan``), config-file loading
(``rlsched.config``) and what they share (``compare``, ``fidelity``, ``conformance``, ...).
"""

__version__ = "0.1.0"
