"""rlsched.traces: the trace schema, loading and validation, synthetic generators, the
shipped sample traces (``traces/data/``) and the trajectory processor.

Public names (a contract other packages code against): ``TRACE_COLUMNS``,
``OPTIONAL_COLUMNS``, ``load_trace``, ``validate_trace``, ``write_trace``, ``draw_batches``,
``generate_trace``, ``PRESETS``, ``GenParams``, ``trace_stats``, ``sample_trace_path``,
``process_group``, ``TrajTokens``, ``GroupResult``.
"""

from rlsched.traces.batches import DrawnTrajectory, draw_batches
from rlsched.traces.generate import generate_trace
from rlsched.traces.load import load_trace, sample_trace_path, write_trace
from rlsched.traces.presets import PRESETS, GenParams
from rlsched.traces.processor import (
    GroupResult,
    TrajTokens,
    TreeNode,
    groups_from_trace,
    process_group,
)
from rlsched.traces.schema import OPTIONAL_COLUMNS, TRACE_COLUMNS, validate_trace
from rlsched.traces.stats import trace_stats

__all__ = [
    "OPTIONAL_COLUMNS",
    "PRESETS",
    "TRACE_COLUMNS",
    "DrawnTrajectory",
    "GenParams",
    "GroupResult",
    "TrajTokens",
    "TreeNode",
    "draw_batches",
    "generate_trace",
    "groups_from_trace",
    "load_trace",
    "process_group",
    "sample_trace_path",
    "trace_stats",
    "validate_trace",
    "write_trace",
]
