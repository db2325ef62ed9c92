"""The registry of log importers and :func:`import_traces`, the one entry point.

An importer reads one file into trajectories (``read(path, counter)`` returns the
trajectories and the parts of the file it had to skip, or raises
:class:`~rlsched.cluster.errors.TraceError` to skip the whole file). ``import_traces`` runs
it over every input -- a directory stands for the files under it with the importer's
suffixes -- and keeps going past bad files, so one broken log does not sink an import of
thousands; the result lists what was skipped and why. Only when nothing at all could be
imported does it fail.
"""

from __future__ import annotations

import difflib
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from rlsched.cluster.errors import TraceError
from rlsched.traces import (
    import_messages,
    import_mini_swe_agent,
    import_openhands,
    import_swe_agent,
    import_verl,
)
from rlsched.traces.import_common import RECORDED_SOURCE, ImportedTrajectory, to_frame
from rlsched.traces.tokens import TokenCounter, load_counter

ReadFn = Callable[[Path, TokenCounter], tuple[list[ImportedTrajectory], list[tuple[str, str]]]]


@dataclass(frozen=True)
class Importer:
    name: str
    description: str
    suffixes: tuple[str, ...]
    read: ReadFn


IMPORTERS: dict[str, Importer] = {
    "swe-agent": Importer(
        "swe-agent", "SWE-agent .traj files (0.x and 1.x), one trajectory per file",
        import_swe_agent.SUFFIXES, import_swe_agent.read_file),
    "messages": Importer(
        "messages", "JSON lines of chat transcripts (OpenAI messages, ShareGPT "
        "conversations, role/text trajectories), one trajectory per line",
        import_messages.SUFFIXES, import_messages.read_file),
    "openhands": Importer(
        "openhands", "OpenHands evaluation output.jsonl (V0 event history or V1 SDK events), "
        "one evaluated instance per line", import_openhands.SUFFIXES, import_openhands.read_file),
    "mini-swe-agent": Importer(
        "mini-swe-agent", "mini-swe-agent .traj.json files (1.x and 2.x message layouts), one "
        "trajectory per file", import_mini_swe_agent.SUFFIXES, import_mini_swe_agent.read_file),
    "verl": Importer(
        "verl", "verl rollout_data_dir dumps (<step>.jsonl: decoded input/output and score), one "
        "rollout per line", import_verl.SUFFIXES, import_verl.read_file),
}


@dataclass(frozen=True)
class ImportResult:
    """``df``: the canonical trace; ``imported``: trajectories in it; ``skipped``: (input,
    reason) for every file or line left out; ``env_estimated``: rows whose env time was
    estimated; ``token_source``: how tokens were counted where the log recorded no usage;
    ``token_recorded``: rows whose counts are the usage the log recorded."""

    df: pd.DataFrame
    imported: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    token_source: str = ""
    env_estimated: int = 0
    files: int = 0
    #: Rows whose token counts are the model API's reported usage (``recorded:usage``).
    token_recorded: int = 0
    #: What the summary must tell beyond the counts (a column left out, and why).
    notes: tuple[str, ...] = ()


def get_importer(fmt: str) -> Importer:
    if fmt in IMPORTERS:
        return IMPORTERS[fmt]
    close = difflib.get_close_matches(fmt, list(IMPORTERS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise TraceError(f"unknown import format {fmt!r}{hint} — expected one of "
                     f"{', '.join(IMPORTERS)}")


def _device(path: Path) -> bool:
    """A character or block device or a socket: no log, and /dev/zero never ends."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False  # (the importer's read names the problem)
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode)


def _expand(paths: Iterable[str | Path], suffixes: Sequence[str],
            skipped: list[tuple[str, str]]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file()
                           and p.suffix.lower() in suffixes)
            if not found:
                skipped.append((str(path), f"a directory with no {'/'.join(suffixes)} files"))
            files.extend(found)
        elif not path.exists():
            skipped.append((str(path), "no such file"))
        elif _device(path):  # (/dev/zero was read until memory ran out; a pipe still reads)
            skipped.append((str(path), "a device, not a log file"))
        else:
            files.append(path)
    return _once(files, skipped)


def _once(files: list[Path], skipped: list[tuple[str, str]]) -> list[Path]:
    """Each file once: a log reached again (a folder and a file in it, a name given twice,
    a symlink) is skipped with the path it was first read as. It was imported twice -- every
    trajectory a second time as ``<id>#2``, doubling its groups -- with exit code 0."""
    first: dict[Path, Path] = {}
    out: list[Path] = []
    for path in files:
        seen = first.setdefault(path.resolve(), path)
        if seen is path:
            out.append(path)
        else:
            what = "reached twice" if seen == path else f"the same file as {seen}"
            skipped.append((str(path), f"{what}, already imported — expected each log once"))
    return out


def import_traces(fmt: str, paths: Iterable[str | Path], *,
                  tokenizer: str | Path | TokenCounter | None = None) -> ImportResult:
    """Import agent logs of format ``fmt`` (a key of ``IMPORTERS``) into one trace.

    ``tokenizer``: None counts tokens with the ``chars/4`` estimate; a path is a local
    Hugging Face tokenizer directory; a ``TokenCounter`` is used as is. Bad files and lines
    are skipped and listed in ``ImportResult.skipped``; if nothing could be imported,
    raises :class:`TraceError` naming the first problem.
    """
    importer = get_importer(fmt)
    if isinstance(paths, str | Path):
        paths = [paths]
    counter = load_counter(tokenizer)
    skipped: list[tuple[str, str]] = []
    files = _expand(paths, importer.suffixes, skipped)
    trajs: list[ImportedTrajectory] = []
    for path in files:
        try:
            got, bad = importer.read(path, counter)
        except TraceError as err:
            skipped.append((str(path), str(err).removeprefix(f"{path}: ")))
            continue
        trajs.extend(got)
        skipped.extend(bad)
    if not trajs:
        if not skipped:
            raise TraceError(f"no input files given — expected {fmt} files or directories")
        where, reason = skipped[0]
        more = f" (and {len(skipped) - 1} more skipped)" if len(skipped) > 1 else ""
        raise TraceError(f"nothing imported, every input was skipped: {where}: {reason}{more}")
    df = to_frame(trajs, counter.source, source=f"import of {len(files)} {fmt} file(s)")
    return ImportResult(df=df, imported=len(trajs), skipped=skipped,
                        token_source=counter.source,
                        env_estimated=int(df["env_estimated"].sum()), files=len(files),
                        token_recorded=int((df["token_source"] == RECORDED_SOURCE).sum()),
                        notes=_step_notes(trajs))


def _step_notes(trajs: Sequence[ImportedTrajectory]) -> tuple[str, ...]:
    """A trace has a ``step`` column only when every trajectory recorded its step (a
    replay then draws the recorded batches); when only some did, the column is left out,
    and the summary says so, naming the first without one -- it was left out silently."""
    missing = [t.trajectory_id for t in trajs if t.step is None]
    if not missing or len(missing) == len(trajs):
        return ()
    return (f"step: recorded on {len(trajs) - len(missing)} of {len(trajs)} trajectories "
            f"(not on {missing[0]!r}"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
            + "), so the trace has no step column and a replay draws its batches at random; "
            "give every trajectory its step to replay the recorded batches",)
