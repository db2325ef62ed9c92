"""``plan --ray`` at an address nothing answers (session 19's CLI audit): it needs the ray
package, so it runs in the live stage (``pytest -m live tests/live``), where ray is
installed; the audit's other tests are in ``tests/test_s19_cli_audit.py``."""

from __future__ import annotations

import pytest
from fuzz_kit import judge_cli, run_cli
from test_s19_cli_audit import FAST, _closed_port, write_trace

pytestmark = pytest.mark.live


@pytest.mark.parametrize("form", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}"])
def test_plan_ray_address_nothing_answers_is_one_line_in_seconds(tmp_path, form):
    """``ray.init`` retried an address nothing answers at for many minutes (``--ray
    bogus:1234`` was still retrying after 6.5 minutes), deaf to Ctrl-C and SIGTERM while
    it waited inside Ray's client; now a connection attempt refuses it first."""
    address = form.format(port=_closed_port())
    out = tmp_path / "out"
    res = run_cli(["plan", "--trace", str(write_trace(tmp_path)), *FAST, "--no-sensitivity",
                   "--no-report", "--workers", "1", "--trials", "1", "--ray", address,
                   "--out", str(out)], limit_s=30)
    assert judge_cli(res, True) == "clean error"
    assert f"--ray {address}: cannot connect to a Ray cluster (nothing answers at" in res.err
    assert not out.exists()
