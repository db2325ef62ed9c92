"""One look for every plot: a fixed colour per GPU state, units, and figure defaults.

A reader compares plots of different policies side by side, so a state must never change
colour between plots. The palette is Okabe-Ito (distinguishable with the common forms of
colour blindness); sub-causes of one state (e.g. rollout idle *on the long tail* vs *with
no work*) keep the state's colour and differ by hatch, so the colour still says the state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import matplotlib
from matplotlib.axes import Axes
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from rlsched.cluster.ids import GpuState

# Plot and table order: rollout states, then training, then the rest.
STATE_ORDER: tuple[str, ...] = (
    GpuState.GENERATE.value,
    GpuState.TOOL_WAIT.value,
    GpuState.ROLLOUT_IDLE.value,
    GpuState.SYNC.value,
    GpuState.SWITCH.value,
    GpuState.TRAIN.value,
    GpuState.TRAIN_IDLE.value,
    GpuState.IDLE.value,
    GpuState.FAILED.value,
)
STATE_COLORS: dict[str, str] = {
    GpuState.GENERATE.value: "#0072B2",  # blue
    GpuState.TOOL_WAIT.value: "#56B4E9",  # sky blue
    GpuState.ROLLOUT_IDLE.value: "#E69F00",  # orange
    GpuState.SYNC.value: "#CC79A7",  # reddish purple
    GpuState.SWITCH.value: "#D55E00",  # vermillion
    GpuState.TRAIN.value: "#009E73",  # bluish green
    GpuState.TRAIN_IDLE.value: "#F0E442",  # yellow
    GpuState.IDLE.value: "#BBBBBB",  # grey
    GpuState.FAILED.value: "#3A3A3A",  # near black
}
STATE_LABELS: dict[str, str] = {
    GpuState.GENERATE.value: "generating",
    GpuState.TOOL_WAIT.value: "waiting on tools",
    GpuState.ROLLOUT_IDLE.value: "rollout idle",
    GpuState.SYNC.value: "weight sync",
    GpuState.SWITCH.value: "switching roles",
    GpuState.TRAIN.value: "training",
    GpuState.TRAIN_IDLE.value: "trainer waiting for data",
    GpuState.IDLE.value: "idle (no role)",
    GpuState.FAILED.value: "failed (fault injection)",
}
UNRECORDED = "unrecorded"  # GPU-time no interval covers (should not happen)
UNRECORDED_COLOR = "#FFFFFF"
BUSY_STATES = frozenset({GpuState.GENERATE.value, GpuState.TRAIN.value})
HATCHES = ("", "//", "..", "xx")
BUSY_LINE = "#000000"
POLICY_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
# Policies (lines, grouped bars) get Paul Tol's dark "muted" tones, so a policy is never
# mistaken for a GPU state's colour.
POLICY_COLORS = ("#332288", "#882255", "#117733", "#999933", "#44AA99", "#AA4499", "#661100", "#6699CC")


def policy_color(i: int) -> str:
    return POLICY_COLORS[i % len(POLICY_COLORS)]

P = ParamSpec("P")
R = TypeVar("R")

STATE_CMAP = ListedColormap([STATE_COLORS[s] for s in STATE_ORDER] + [UNRECORDED_COLOR])


def color(state: str) -> str:
    return STATE_COLORS.get(state, UNRECORDED_COLOR)


def time_unit(seconds: float) -> tuple[float, str]:
    """Divisor and label that keep a time axis in readable numbers."""
    if seconds >= 3 * 3600:
        return 3600.0, "h"
    if seconds >= 3 * 60:
        return 60.0, "min"
    return 1.0, "s"


RC: dict[str, Any] = {
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "font.size": 10,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "hatch.linewidth": 0.6,
}


def styled(fn: Callable[P, R]) -> Callable[P, R]:
    """Run a plot function under the house rc settings without touching the caller's
    global matplotlib state (the library may be used from a notebook)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with matplotlib.rc_context(RC):
            return fn(*args, **kwargs)

    return wrapper


def new_axes(ax: Axes | None, size: tuple[float, float] = (9.0, 4.0)) -> Axes:
    """The given axes, or a fresh figure's (plot functions all take an optional ``ax``)."""
    if ax is not None:
        return ax
    fig = Figure(figsize=size, layout="constrained")
    return fig.add_subplot()


def png_bytes(fig: Figure) -> bytes:
    """Render a figure to PNG bytes.

    Figures are made with :class:`~matplotlib.figure.Figure`, not pyplot, so nothing is
    registered globally and nothing needs closing, and no GUI backend is ever chosen."""
    import io

    buf = io.BytesIO()
    with matplotlib.rc_context(RC):
        fig.savefig(buf, format="png")
    return buf.getvalue()
