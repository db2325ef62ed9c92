"""rlsched: keep GPUs busy in agent RL.

The top-level folders of the repository are subpackages of this one (``rlsched.cluster``,
``rlsched.policies``, ``rlsched.traces``, ``rlsched.sim``, ``rlsched.real``,
``rlsched.analysis``); this package itself holds the command line and config loading.
"""

__version__ = "0.1.0"
