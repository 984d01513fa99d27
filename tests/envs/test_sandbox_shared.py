"""The sandbox layer shared by the code env and the AgentBench OS env (envs/sandbox/)."""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest
from astraflow.envs.agentbench.os import sandbox as os_sandbox
from astraflow.envs.sandbox import Limits, SandboxError
from astraflow.envs.sandbox.base import prepare_run
from astraflow.envs.sandbox.bwrap import ROOT_LINKS, top_level_binds


def test_one_error_type_for_both_envs():
    assert os_sandbox.SandboxError is SandboxError


def test_every_backend_reads_its_arguments_the_same_way():
    req = prepare_run("print(1)", {"a/b.txt": "x"}, None, "in", None, python="/usr/bin/python3")
    assert req.argv == ["/usr/bin/python3", "main.py"]
    assert req.files == {"a/b.txt": b"x", "main.py": b"print(1)"}
    assert (req.stdin, req.limits) == (b"in", Limits())
    # docker passes no interpreter: the image's python3 is used as named
    assert prepare_run(None, {"f": b""}, ["python3", "-V"], b"", None).argv == ["python3", "-V"]
    with pytest.raises(ValueError, match="without '..'"):
        prepare_run(None, {"../x": ""}, None, b"", None)


def test_top_level_binds_keep_symlinks_and_skip_missing_dirs():
    args = top_level_binds([*ROOT_LINKS, "usr", "no-such-dir"], lambda p: ["--ro-bind", p, p])
    assert "/no-such-dir" not in args
    assert args[args.index("/usr") - 1] == "--ro-bind"
    for name in ROOT_LINKS:
        path = f"/{name}"
        if os.path.islink(path):
            i = args.index(path)
            assert args[i - 2 : i] == ["--symlink", os.readlink(path)]


def test_shlex_quote_round_trips_the_supervisor_source_through_sh():
    """The overlay sandbox passes its supervisor's source through ``/bin/sh -c`` quoted."""
    text = os_sandbox.SUPERVISOR_SOURCE[:2000] + "\n'quotes' \"and\" $VARS `ticks`"
    out = subprocess.run(
        ["/bin/sh", "-c", "printf %s " + shlex.quote(text)], capture_output=True, text=True
    )
    assert out.stdout == text
