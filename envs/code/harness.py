"""Turning (solution, tests) into ONE sandbox program that reports each test separately.

Why: HumanEval/MBPP tests are a ``check(candidate)`` function with many asserts. Running the whole
function gives pass/fail only; running one sandbox per assert costs a container each. Instead we
split the check body with :mod:`ast` into steps (each top-level statement that contains an assert is
a test; others are setup), and a small harness executes them in order inside one run, with a
per-test timer, printing one result line per test. The pass fraction is tests passed / tests.

Limits of the approach (documented, not hidden): the harness runs in the same interpreter as the
solution, so hostile code could forge result lines; the nonce in each line and the deletion of the
harness file make that harder, not impossible. The sandbox still contains whatever the code does.
"""

from __future__ import annotations

import ast
import json
import secrets
import threading
import warnings
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Step:
    source: str
    is_test: bool


@dataclass(frozen=True)
class TestPlan:
    prelude: str
    steps: tuple[Step, ...]

    @property
    def n_tests(self) -> int:
        return sum(s.is_test for s in self.steps)


def _has_real_assert(node: ast.AST) -> bool:
    """True when ``node`` contains an assert that is not trivially true (``assert True, ...``)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assert) and not (
            isinstance(sub.test, ast.Constant) and bool(sub.test.value)
        ):
            return True
    return False


#: CPython 3.11's ``ast.parse`` is not thread-safe (its recursion-depth bookkeeping raises
#: "SystemError: AST constructor recursion depth mismatch" under concurrent calls), and neither is
#: ``warnings.catch_warnings``; envs are created from many threads, so parsing is serialized.
_PARSE_LOCK = threading.Lock()


def parse_python(source: str) -> ast.Module:
    with _PARSE_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
        return ast.parse(source)


def plan_tests(tests: str | list[str]) -> TestPlan:
    """Split test code into a prelude and steps.

    ``tests`` is either module source with a ``check(candidate)`` function (HumanEval/MBPP format),
    module source with top-level asserts, or a list of statements (each one step).
    """
    if isinstance(tests, list):
        steps = []
        for i, src in enumerate(tests):
            try:
                tree = parse_python(src)
            except SyntaxError as exc:
                raise ValueError(f"tests[{i}] is not valid Python: {exc}") from exc
            steps.append(Step(src, _has_real_assert(tree)))
        return TestPlan("", tuple(steps))
    try:
        module = parse_python(tests)
    except SyntaxError as exc:
        raise ValueError(f"task tests are not valid Python: {exc}") from exc
    check = next(
        (n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None
    )
    if check is None:
        return TestPlan("", tuple(Step(ast.unparse(n), _has_real_assert(n)) for n in module.body))
    prelude = ast.unparse(ast.Module([n for n in module.body if n is not check], type_ignores=[]))
    steps = tuple(Step(ast.unparse(n), _has_real_assert(n)) for n in check.body)
    return TestPlan(prelude, steps)


HARNESS = r"""
import json as _json, os as _os, signal as _signal, sys as _sys
_D = _json.loads(__DATA__)
_NONCE = _D["nonce"]
try:
    _os.remove(__file__)
except OSError:
    pass
_res = _os.fdopen(_os.dup(1), "w")
_os.dup2(2, 1)
_sys.stdout = _sys.stderr


def _emit(rec):
    _res.write(_NONCE + _json.dumps(rec) + "\n")
    _res.flush()


class _Timeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


_signal.signal(_signal.SIGALRM, _on_alarm)


def _run(src, name, seconds, g):
    _signal.setitimer(_signal.ITIMER_REAL, seconds)
    try:
        exec(compile(src, name, "exec"), g)
        return None
    except _Timeout:
        return "timeout after %.1fs" % seconds
    except AssertionError as exc:
        return "AssertionError" + (": %s" % exc if str(exc) else "")
    except BaseException as exc:
        return "%s: %s" % (type(exc).__name__, exc)
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)


_g = {"__name__": "solution", "__builtins__": __builtins__}
_err = _run(_D["solution"], "solution.py", _D["load_timeout"], _g)
_emit({"kind": "load", "ok": _err is None, "error": _err})
if _err is None:
    _perr = _run(_D["prelude"], "tests.py", _D["load_timeout"], _g)
    if _perr is not None:
        _emit({"kind": "setup", "i": -1, "ok": False, "error": _perr})
    if _D["entry_point"] and _D["entry_point"] not in _g:
        _emit({"kind": "setup", "i": -1, "ok": False,
               "error": "the solution does not define %r" % _D["entry_point"]})
    _g["candidate"] = _g.get(_D["entry_point"])
    for _i, (_src, _is_test) in enumerate(_D["steps"]):
        _e = _run(_src, "test_%d" % _i, _D["test_timeout"], _g)
        if _is_test:
            _emit({"kind": "test", "i": _i, "ok": _e is None, "error": _e})
        elif _e is not None:
            _emit({"kind": "setup", "i": _i, "ok": False, "error": _e})
_emit({"kind": "done"})
_res.close()
_os._exit(0)
"""


def build_program(
    solution: str,
    plan: TestPlan,
    entry_point: str,
    *,
    test_timeout_s: float = 3.0,
    load_timeout_s: float = 5.0,
) -> tuple[str, str]:
    """The harness program and the nonce that prefixes its result lines."""
    nonce = "@@AF-" + secrets.token_hex(8) + "@@"
    data = {
        "nonce": nonce,
        "solution": solution,
        "prelude": plan.prelude,
        "entry_point": entry_point,
        "steps": [[s.source, s.is_test] for s in plan.steps],
        "test_timeout": float(test_timeout_s),
        "load_timeout": float(load_timeout_s),
    }
    return HARNESS.replace("__DATA__", repr(json.dumps(data))), nonce


@dataclass
class TestReport:
    """Per-test outcome of one harness run."""

    n_tests: int
    passed: int = 0
    loaded: bool = False
    load_error: str | None = None
    finished: bool = False
    results: list[dict] = field(default_factory=list)
    setup_errors: list[str] = field(default_factory=list)

    @property
    def pass_fraction(self) -> float:
        return self.passed / self.n_tests if self.n_tests else 0.0


def parse_report(stdout: str, nonce: str, plan: TestPlan) -> TestReport:
    """Results from the harness's output; tests with no line (crash, kill, timeout) count as failed."""
    report = TestReport(n_tests=plan.n_tests)
    seen: dict[int, dict] = {}
    for line in stdout.splitlines():
        if not line.startswith(nonce):
            continue
        try:
            rec = json.loads(line[len(nonce) :])
        except json.JSONDecodeError:
            continue
        kind = rec.get("kind")
        if kind == "load":
            report.loaded = bool(rec.get("ok"))
            report.load_error = rec.get("error")
        elif kind == "setup":
            report.setup_errors.append(str(rec.get("error")))
        elif kind == "test" and isinstance(rec.get("i"), int) and rec["i"] not in seen:
            seen[rec["i"]] = rec
        elif kind == "done":
            report.finished = True
    for i, step in enumerate(plan.steps):
        if not step.is_test:
            continue
        rec = seen.get(i)
        ok = bool(rec and rec.get("ok"))
        error = (
            None
            if ok
            else (rec.get("error") if rec else "not run (the program stopped before this test)")
        )
        report.results.append({"test": step.source, "passed": ok, "error": error})
        report.passed += ok
    return report
