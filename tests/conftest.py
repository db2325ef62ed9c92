import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def compare_trace(tmp_path_factory) -> Path:
    """A small long-tailed trace file (16 tasks x 2 samples) for command-line runs."""
    from rlsched.traces import generate_trace, write_trace

    path = tmp_path_factory.mktemp("trace") / "t.parquet"
    write_trace(generate_trace("longtail-small", seed=3, tasks=16, samples=2), path)
    return path
