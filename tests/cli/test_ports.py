"""A port a user picks is checked where they typed it: out of range is refused by the option's
type, one in use is said in one line with what to do (both printed 51-58-line tracebacks)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from astraflow.protocol.http_server import PortUnavailable, bind_socket


def test_a_port_in_use_is_one_line_naming_it(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")  # a run directory, as the dashboard reads one
    (tmp_path / "run.secret").write_text("s3cret-s3cret-s3cret")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortUnavailable, match=f"127.0.0.1:{port}: the port is in use"):
            bind_socket("127.0.0.1", port)
        # through the CLI: exit 1, the sentence, no traceback
        run = subprocess.run(
            [sys.executable, "-m", "astraflow.cli.main", "dashboard", str(tmp_path),
             "--port", str(port)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "the port is in use" in out and "Traceback" not in out, out


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_an_out_of_range_port_is_refused_by_its_option(port, tmp_path):
    from astraflow.cli.main import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["dashboard", str(tmp_path), "--port", port])
    assert result.exit_code == 2
    assert "Invalid value for '--port'" in result.output
