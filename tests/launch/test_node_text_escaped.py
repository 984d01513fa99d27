"""Text a rollout node sends (its name, region, episode errors, transcripts) reaches the operator's
terminal as text: never read as Rich markup (``[/]`` once crashed ``astraflow train`` and
``astraflow status``), never as terminal control (OSC 52 writes the clipboard, ``ESC [2J`` clears
the screen). Each case drives the real renderer with a hostile status document or record and reads
what a terminal would get (see :func:`astraflow.launch.text.safe_text`)."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

import pytest
import typer
from rich.console import Console

from astraflow.launch.live import render_status, status_line
from astraflow.launch.stall import StallWatch
from astraflow.launch.text import safe_text
from astraflow.protocol.messages import EvaluationResult
from astraflow.protocol.status import (
    DataflowStatus,
    ErrorSummary,
    NodeStatus,
    NodeSummary,
    PolicyStatus,
    RegionNodes,
)

OSC52 = "\x1b]52;c;AAAA\x07"
CLEAR = "\x1b[2J"
HOSTILE_ERROR = f"[/] boom {OSC52}{CLEAR}\r\x9b2Jdone\x1b[3;1Hmoved"
#: what none of the rendered output may hold (Rich's own styling is CSI "m" codes only)
FORBIDDEN = ("\x1b]", "\x07", CLEAR, "\x9b", "\x1b[3;1H", "\r")


def console() -> Console:
    return Console(
        file=io.StringIO(), force_terminal=True, record=True, width=250, color_system="truecolor"
    )


def shown(con: Console) -> tuple[str, str]:
    """(what the terminal received, the same as plain text)"""
    return con.file.getvalue(), con.export_text(styles=False)


def assert_safe(raw: str) -> None:
    for bad in FORBIDDEN:
        assert bad not in raw, f"{bad!r} reached the terminal"


def hostile_status(episodes: int = 10) -> DataflowStatus:
    policy = PolicyStatus(
        trainable=True,
        latest_version=0,
        weight_location=None,
        steps=0,
        max_steps=40,
        buffer_groups=0,
        buffer_samples=0,
        unacked_batches=0,
        staleness={},
        dropped={"episode_error": episodes},
    )
    node = NodeStatus(
        id=f"n-{OSC52}1",
        name="[/]",
        region="[bold]x",
        state="active",
        last_heartbeat=0.0,
        seconds_since_heartbeat=1.0,
        versions={"policy": 0},
        episodes=episodes,
        episodes_per_s=1.0,
        active_leases=1,
    )
    return DataflowStatus(
        run="r",
        mode="async",
        time=0.0,
        done=False,
        training_done=False,
        queue={"train": 3},
        in_flight_leases=1,
        expired_leases=0,
        tasks_done=0,
        episodes=episodes,
        episodes_per_s=1.0,
        nodes=[node],
        # more registered than listed: the "N of M nodes shown" line names the regions
        node_summary=NodeSummary(
            active=3, regions={"[/]" + CLEAR: RegionNodes(active=3)}, episodes=episodes
        ),
        policies={"policy": policy},
        evaluations=[
            EvaluationResult(
                id="e",
                policy="policy",
                version=0,
                step=0,
                task_set="[/]",
                split="test",
                num_tasks=1,
            )  # fmt: skip
        ],
        dataflow_policies=[],
        errors={"episode_error": ErrorSummary(count=episodes, first=HOSTILE_ERROR)},
    )


def test_safe_text_contract():
    assert safe_text("[/]") == "\\[/]"
    assert safe_text("[/]", markup=False) == "[/]"
    assert safe_text(f"a{OSC52}b{CLEAR}c\x00\x7f\x85d", markup=False) == "abcd"
    assert safe_text("a\tb\r\nc\nd", markup=False) == "a b c d"
    assert safe_text("a\r\nb\rc\nd", markup=False, multiline=True) == "a\nb\nc\nd"
    assert safe_text("x" * 50, 10, markup=False) == "x" * 9 + "…"
    assert safe_text(None) == "" and safe_text(3) == "3"
    assert safe_text("\u202eevil", markup=False) == "evil"  # bidi override
    assert safe_text("unterminated \x1b]52;c;AAAA", markup=False) == "unterminated "
    con = console()
    con.print(safe_text("[bold]x [/] y"))
    raw, text = shown(con)
    assert "[bold]x [/] y" in text


def test_live_view_shows_node_text_as_text():
    """The launcher's live view (``render_status``): a node named ``[/]`` froze it."""
    con = console()
    con.print(render_status(hostile_status(), [], "runs/r", time.time()))
    raw, text = shown(con)
    assert_safe(raw)
    assert "[/]" in text  # the node's name, the region, the error, the task set: as written
    assert "[bold]x" in text
    assert "[/] boom" in text
    assert "n-1" in text  # the OSC sequence is gone, the id around it stays


def test_status_once_shows_node_text_as_text(monkeypatch):
    """``astraflow status URL --once`` prints the same renderer; it crashed on a node named
    ``[/]``."""
    import astraflow.cli.status as cli_status

    class Client:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def status(self):
            return hostile_status()

    con = console()
    monkeypatch.setattr(cli_status, "dataflow_client", lambda *a, **k: Client())
    monkeypatch.setattr(cli_status, "console", con)
    cli_status.status(
        url="http://127.0.0.1:1", token="t", ca_file=None, once=True, interval=1.0, run_dir=None
    )
    raw, text = shown(con)
    assert_safe(raw)
    assert "[/]" in text and "[bold]x" in text and "[/] boom" in text


def test_no_live_status_line_prints_errors_as_text():
    """``astraflow train --no-live`` prints :func:`status_line` with ``console.print`` (markup
    on): an episode error ``[/]`` raised MarkupError there and stopped the run."""
    con = console()
    con.print(status_line(hostile_status(), 12.0), highlight=False)  # as cli/train.py does
    raw, text = shown(con)
    assert_safe(raw)
    assert "[/] boom" in text
    assert text.startswith("[    12s] policy: step 0/40")


def test_stall_message_quotes_the_error_as_text(monkeypatch):
    """The launcher's final "run stopped" message quotes the first episode error."""
    import astraflow.cli.common as common

    watch = StallWatch(10.0)
    assert watch.check(hostile_status(episodes=0), now=0.0) is None
    stall = watch.check(hostile_status(episodes=20), now=20.0)
    assert stall is not None and stall.cause == "episodes_failing"
    assert_safe(stall.message)
    con = console()
    monkeypatch.setattr(common, "err_console", con)
    with pytest.raises(typer.Exit):
        common.fail(f"run stopped: {stall.message}", 4)  # as cli/train.py does
    raw, text = shown(con)
    assert_safe(raw)
    assert "[/] boom" in text


def test_transcripts_print_node_text_as_text(monkeypatch):
    """``astraflow transcripts``: the policy's and env's text and the error, without control."""
    import astraflow.cli.transcripts as cli_transcripts

    record = SimpleNamespace(
        step=3, episode_id=f"ep{OSC52}", task_id="[/]", finish_reason="stop",
        rewards={"policy": 1.0}, advantages={}, error=HOSTILE_ERROR, policy={"policy": "policy"},
        fates={"[/]\x1b]0;pwn\x07": "trained", "policy": "filtered"}, trained_steps={},
    )  # fmt: skip
    turn = SimpleNamespace(
        role="policy", source="policy", versions=[3], tokens=5, text=f"line1\n{CLEAR}[/]line2"
    )
    con = console()
    monkeypatch.setattr(cli_transcripts, "console", con)
    cli_transcripts.print_transcript(SimpleNamespace(record=record, turns=[turn]))
    raw, text = shown(con)
    assert_safe(raw)
    assert "task [/]" in text and "error: [/] boom" in text
    assert "│ line1 " in text and "│ [/]line2" in text  # a transcript keeps its lines


def test_eval_tables_show_env_statuses_as_text():
    """AgentBench's status names come from the env: ``[/]`` crashed the report table."""
    from astraflow.cli.eval import render_tables

    fam = {
        "total": 1, "skipped": 0, "passed": 0, "success_rate": 0.0, "avg_turns": 1.0,
        "by_type": {f"[bold]t{CLEAR}": {"passed": 0, "total": 1}}, "status": {"[/]": 1},
    }  # fmt: skip
    con = console()
    for table in render_tables({"tasks": {"os": fam}, "meta": {"split": "dev", "agent": "x"}}):
        con.print(table)
    raw, text = shown(con)
    assert_safe(raw)
    assert "status: [/]" in text and "[bold]t" in text
