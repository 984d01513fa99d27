"""Every Python example in ``docs/`` runs, and the docs' calculator tool refuses code (issue 48, #5).

Why: users copy the docs. ``docs/tools.md``'s calculator once was
``eval(expression, {"__builtins__": {}})``, and one policy tool call through
``astraflow/Tools-v0`` ran a shell command as root. So each fenced ```python block on a docs page
is executed in a fresh interpreter, unless the line before it says why it cannot run alone
(``<!-- fragment: why -->``), and the calculator the docs show (and the one the package ships)
is fed the classic escapes, which must come back refused, quickly, with nothing run.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from astraflow.envs import default_registry

from astraflow.tools.arith import MAX_EXPONENT, ArithmeticRefused, evaluate
from astraflow.tools.calls import ToolCall

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
FRAGMENT = re.compile(r"<!--\s*fragment:\s*(\S.*?)\s*-->\s*$")


def python_blocks() -> list[tuple[str, int, str, str | None]]:
    """(page, line, code, fragment reason or None) for every ```python block in docs/*.md."""
    blocks = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            reason = FRAGMENT.search(before)
            blocks.append((page.name, line, m.group(1), reason.group(1) if reason else None))
    return blocks


BLOCKS = python_blocks()


def test_the_docs_have_python_examples_and_fragments_say_why():
    assert len(BLOCKS) >= 5, "the block extractor found almost nothing: is the fence regex right?"
    assert any(page == "tools.md" and "calculator" in code for page, _, code, _ in BLOCKS)


@pytest.mark.parametrize(
    "page,line,code,fragment", BLOCKS, ids=[f"{p}:{n}" for p, n, _, _ in BLOCKS]
)
def test_every_docs_example_runs(page, line, code, fragment, tmp_path):
    if fragment is not None:
        pytest.skip(f"{page}:{line} is marked a fragment: {fragment}")
    assert "eval(" not in code.replace("literal_eval(", ""), f"{page}:{line} calls eval"
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{page}:{line} failed:\n{done.stderr[-3000:]}"


def docs_calculator(tmp_path: Path):
    """The calculator exactly as docs/tools.md shows it, imported as a recipe would."""
    (code,) = [c for p, _, c, _ in BLOCKS if p == "tools.md" and "# my_tools.py" in c]
    (tmp_path / "my_tools.py").write_text(code)
    return f"{tmp_path / 'my_tools.py'}:calculator"


ESCAPES = [
    "__import__('os').system('touch PWNED')",
    "().__class__.__bases__[0].__subclasses__()",
    "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen']",
    "open('/etc/passwd').read()",
    "(lambda: 1)()",
    "9**9**9",
    "10**10**10",
    "2**100000",
    "(1e308)*10",
    "'a'*10**9",
    "x",
    "1 if 1 else 2",
    "-" * 300 + "1",
    "(" * 200 + "1" + ")" * 200,
]


@pytest.mark.parametrize("expression", ESCAPES)
def test_the_evaluator_refuses_escapes_and_unbounded_work(expression, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    with pytest.raises(ArithmeticRefused) as refused:
        evaluate(expression)
    assert time.perf_counter() - start < 0.5
    assert str(refused.value)  # names what was wrong
    assert not (tmp_path / "PWNED").exists()


def test_the_evaluator_does_arithmetic():
    assert evaluate("123*456") == 56088
    assert evaluate("-(2+3)*4 // 3 % 5") == (-(2 + 3) * 4 // 3) % 5
    assert evaluate("2**10") == 1024 and evaluate("2**-1") == 0.5 and evaluate("7/2") == 3.5
    assert evaluate(f"2**{MAX_EXPONENT}") == 2**MAX_EXPONENT
    with pytest.raises(ArithmeticRefused, match="division by zero"):
        evaluate("1/0")
    with pytest.raises(ArithmeticRefused, match="exponent"):
        evaluate(f"1**{MAX_EXPONENT + 1}")
    with pytest.raises(ArithmeticRefused, match="Attribute.*accepted: numbers"):
        evaluate("(1).real")


def test_the_docs_calculator_through_tools_v0_runs_no_policy_code(tmp_path, monkeypatch):
    """The probe of issue 48 #5: a tool call whose arguments are code, through the env."""
    monkeypatch.chdir(tmp_path)
    env = default_registry().make("astraflow/Tools-v0", tools=[docs_calculator(tmp_path)])
    env.reset(options={"task": {"question": "2*3", "answer": "6"}})
    calls = [ToolCall("calculator", {"expression": e}) for e in ESCAPES[:6]]
    calls.append(ToolCall("calculator", {"expression": "347*582"}))
    messages = env.step(calls)[4]["tool_messages"]
    assert [m["content"].startswith("error: ArithmeticRefused") for m in messages] == [True] * 6 + [
        False
    ]
    assert messages[-1]["content"] == "201954"
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("expression", ESCAPES)
def test_the_shipped_calculator_tool_refuses_escapes(expression, tmp_path, monkeypatch):
    from astraflow.tasks.calculator import calculator

    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    assert calculator(expression).startswith("error:")
    assert time.perf_counter() - start < 0.5 and not (tmp_path / "PWNED").exists()
