"""Turning (solution, tests) into ONE sandbox program that reports each test separately.

Why: HumanEval/MBPP tests are a ``check(candidate)`` function with many asserts. Running the whole
function gives pass/fail only; running one sandbox per assert costs a container each. Instead we
split the check body with :mod:`ast` into steps (each top-level statement that contains an assert is
a test; others are setup), and a small harness executes them in order inside one run, with a
per-test timer, printing one result line per test. The pass fraction is tests passed / tests.

Why two processes: a reward a policy can forge will be learned. The solution therefore never shares
an interpreter, a file descriptor or an output channel with the code that judges it. The harness
(the *judge*) runs the task's tests itself and starts the solution in a fresh child interpreter (an
``exec``, not a ``fork``: no copy of the judge's memory) whose only link to the judge is a pair of
pipes carrying calls and return values. Every name of the solution is a stub in the judge; a call
sends the arguments and gets back plain data (None, bool, int, float, complex, str, bytes, list,
tuple, dict, set, frozenset) or an opaque handle (identity ``==`` only; its truth value computed when it was returned). So an
``__eq__`` that always says yes, a patched ``sys.modules['__main__']``, printed marker lines, or an
``os._exit(0)`` change nothing: the asserts run in the judge, on values the judge decoded. The
judge's result channel is a descriptor the child never inherits; the judge makes itself
non-dumpable (so ``/proc/<judge>/fd`` and its memory are closed to the child) and prefixes its
lines with a nonce that exists only in its own memory (the program file is deleted first).
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
import builtins as _bi, json as _json, os as _os, signal as _signal, subprocess as _sp, sys as _sys
_D = _json.loads(__DATA__)
_NONCE = _D["nonce"]
_HERE = _os.path.dirname(_os.path.abspath(__file__))
try:
    _os.remove(__file__)
except OSError:
    pass
# Files the solution writes into the work dir must never be importable here.
_sys.path[:] = [p for p in _sys.path if p and _os.path.abspath(p) != _HERE]
try:
    import ctypes as _ct

    _ct.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no /proc/<judge>/fd, mem, ptrace
except Exception:
    pass
_res = _os.fdopen(_os.dup(1), "w")
_os.dup2(2, 1)
_sys.stdout = _sys.stderr
_MAX_REPLY = 16 * 1024 * 1024
_MAX_DEPTH = 200


def _emit(rec):
    _res.write(_NONCE + _json.dumps(rec) + "\n")
    _res.flush()


class _Timeout(BaseException):
    pass


class _SolutionError(Exception):
    pass


_ARMED = [False]


def _on_alarm(signum, frame):
    if _ARMED[0]:
        raise _Timeout()


_signal.signal(_signal.SIGALRM, _on_alarm)


class _Remote:
    # A function, class or object that lives in the solution's process.
    __slots__ = ("_key", "_gen", "_truth")

    def __init__(self, key, gen, truth=True):
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_gen", gen)
        object.__setattr__(self, "_truth", truth)

    def __call__(self, *args, **kwargs):
        return _CHILD.rpc("call", self, args=[_enc(a) for a in args],
                          kwargs={str(k): _enc(v) for k, v in kwargs.items()})

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _CHILD.rpc("getattr", self, name=name)

    def __iter__(self):
        return iter(_CHILD.rpc("iter", self))

    def __len__(self):
        n = _CHILD.rpc("len", self)
        if type(n) is not int:
            raise TypeError("len() of a solution object is not an int")
        return n

    def __bool__(self):
        # Computed by the solution when it returned the object: a bool it could return anyway.
        return self._truth

    def __setattr__(self, name, value):
        raise TypeError("objects of the solution are read-only here")

    def __repr__(self):
        return "<solution object %r>" % (self._key,)


def _enc(x, depth=0):
    # Test-side values sent to the solution: plain data or handles.
    if depth > _MAX_DEPTH:
        raise ValueError("argument nested too deep")
    t = type(x)
    if x is None or t in (bool, int, float, str):
        return x
    if t is list:
        return [_enc(v, depth + 1) for v in x]
    if t is tuple:
        return {"t": [_enc(v, depth + 1) for v in x]}
    if t is dict:
        return {"d": [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in x.items()]}
    if t is set or t is frozenset:
        return {"fs" if t is frozenset else "s": [_enc(v, depth + 1) for v in x]}
    if t is bytes:
        return {"b": x.hex()}
    if t is complex:
        return {"c": [x.real, x.imag]}
    if t is _Remote:
        if x._gen != _CHILD.gen:
            raise _SolutionError("an object of a solution process that was restarted")
        return {"h": [x._key, x._truth]}
    raise TypeError("cannot pass a %s to the solution" % t.__name__)


def _dec(v, depth=0):
    # Replies of the solution: only builtins and handles are ever built from them.
    if depth > _MAX_DEPTH:
        raise _SolutionError("reply nested too deep")
    t = type(v)
    if v is None or t in (bool, int, float, str):
        return v
    if t is list:
        return [_dec(x, depth + 1) for x in v]
    if t is dict and len(v) == 1:
        (tag, body), = v.items()
        if tag == "t" and type(body) is list:
            return tuple(_dec(x, depth + 1) for x in body)
        if tag == "d" and type(body) is list:
            out = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise _SolutionError("malformed dict in reply")
                out[_dec(pair[0], depth + 1)] = _dec(pair[1], depth + 1)
            return out
        if tag in ("s", "fs") and type(body) is list:
            items = [_dec(x, depth + 1) for x in body]
            return frozenset(items) if tag == "fs" else set(items)
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "c" and type(body) is list and len(body) == 2:
            return complex(float(body[0]), float(body[1]))
        if (tag == "h" and type(body) is list and len(body) == 2
                and type(body[0]) in (int, str) and type(body[1]) is bool):
            return _Remote(body[0], _CHILD.gen, body[1])
        if tag == "m" and type(body) is str:
            if body in _sys.stdlib_module_names:
                import importlib

                return importlib.import_module(body)
            return _Remote(-1, -1)
    raise _SolutionError("malformed reply from the solution process")


class _Child:
    # The solution's interpreter, restarted after a timeout or a death.
    def __init__(self):
        self.proc = None
        self.gen = 0
        self.seq = 0
        self.names = None
        self.load_error = None

    def kill(self):
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait()
            except Exception:
                pass
            self.proc = None

    def start(self):
        self.kill()
        self.gen += 1
        self.proc = _sp.Popen([_sys.executable, "-I", "-c", _D["child"]], stdin=_sp.PIPE,
                              stdout=_sp.PIPE, stderr=2, close_fds=True, cwd=_HERE)
        try:
            reply = _run_timed(lambda: self.send("load", solution=_D["solution"]),
                               _D["load_timeout"])
        except _SolutionError as exc:
            reply = str(exc)
        if isinstance(reply, str):
            self.kill()
            self.load_error = reply
            return False
        if not reply.get("ok"):
            self.load_error = str(reply.get("error"))
            return False
        names = reply.get("names")
        if type(names) is not dict:
            self.load_error = "malformed reply from the solution process"
            return False
        self.names = names
        self.load_error = None
        return True

    def send(self, op, **body):
        if self.proc is None:
            raise _SolutionError("the solution process is not running")
        self.seq += 1
        body.update(op=op, id=self.seq)
        try:
            self.proc.stdin.write((_json.dumps(body) + "\n").encode())
            self.proc.stdin.flush()
            while True:
                line = self.proc.stdout.readline(_MAX_REPLY)
                if not line:
                    raise _SolutionError("the solution process exited (code %s)" % self.proc.poll())
                if len(line) >= _MAX_REPLY:
                    raise _SolutionError("reply of the solution over %d bytes" % _MAX_REPLY)
                try:
                    reply = _json.loads(line)
                except (ValueError, RecursionError):
                    raise _SolutionError("malformed reply from the solution process")
                if type(reply) is dict and reply.get("id") == self.seq:
                    return reply
        except (BrokenPipeError, OSError) as exc:
            raise _SolutionError("the solution process is gone: %s" % exc)

    def rpc(self, op, target, **body):
        if target._gen != self.gen:
            raise _SolutionError("an object of a solution process that was restarted")
        try:
            reply = self.send(op, target=target._key, **body)
        except (_Timeout, _SolutionError):
            self.kill()
            raise
        if reply.get("ok") is True:
            return _dec(reply.get("value"))
        # A builtin exception type is re-raised as itself, so tests expecting one still work.
        kind = getattr(_bi, str(reply.get("type")), None)
        if not (isinstance(kind, type) and issubclass(kind, Exception)) or kind is AssertionError:
            kind = _SolutionError
        raise kind(str(reply.get("error"))[:2000])


_CHILD = _Child()


def _run_timed(fn, seconds):
    _ARMED[0] = True
    _signal.setitimer(_signal.ITIMER_REAL, seconds)
    try:
        return fn()
    except _Timeout:
        return "timeout after %.1fs" % seconds
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _ARMED[0] = False


def _run(src, name, seconds, g):
    def _go():
        exec(compile(src, name, "exec"), g)

    try:
        err = _run_timed(_go, seconds)
    except AssertionError as exc:
        return "AssertionError" + (": %s" % exc if str(exc) else "")
    except RecursionError as exc:
        _CHILD.kill()
        return "RecursionError: %s" % exc
    except _SolutionError as exc:
        return str(exc)
    except BaseException as exc:
        return "%s: %s" % (type(exc).__name__, exc)
    if isinstance(err, str):
        _CHILD.kill()
    return err


def _test_globals():
    g = {"__name__": "tests", "__builtins__": _bi}
    for name, value in _CHILD.names.items():
        try:
            g[str(name)] = _dec(value)
        except Exception:
            pass
    return g


_ok = _CHILD.start()
_emit({"kind": "load", "ok": _ok, "error": _CHILD.load_error})
if _ok:
    _g = _test_globals()
    _perr = _run(_D["prelude"], "tests.py", _D["load_timeout"], _g)
    if _perr is not None:
        _emit({"kind": "setup", "i": -1, "ok": False, "error": _perr})
    _ep = _D["entry_point"]
    if _ep and type(_g.get(_ep)) is not _Remote:
        _emit({"kind": "setup", "i": -1, "ok": False,
               "error": "the solution does not define %r" % _ep})
    _g["candidate"] = _g.get(_ep)
    for _i, (_src, _is_test) in enumerate(_D["steps"]):
        if _CHILD.proc is None or _CHILD.proc.poll() is not None:
            _CHILD.start()
            _g.update({k: v for k, v in _test_globals().items() if type(v) is _Remote})
            _g["candidate"] = _g.get(_ep)
        _e = _run(_src, "test_%d" % _i, _D["test_timeout"], _g)
        if _is_test:
            _emit({"kind": "test", "i": _i, "ok": _e is None, "error": _e})
        elif _e is not None:
            _emit({"kind": "setup", "i": _i, "ok": False, "error": _e})
_CHILD.kill()
_emit({"kind": "done"})
_res.close()
_os._exit(0)
"""

#: The solution's interpreter: loads the solution, answers calls with plain data. It holds no
#: secret and no result channel; whatever it sends is only data the judge decodes.
CHILD = r"""
import itertools, json, os, sys
_rin = os.fdopen(os.dup(0), "rb")
_rout = os.fdopen(os.dup(1), "wb")
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.dup2(2, 1)
sys.stdin = open(os.devnull)
sys.stdout = sys.stderr
_g = {"__name__": "solution", "__builtins__": __builtins__}
_handles = {}


def _handle(x):
    key = id(x)
    _handles[key] = x
    try:
        truth = bool(x)
    except Exception:
        truth = True
    return {"h": [key, truth]}


def _enc(x, depth=0):
    if depth > 150:
        raise ValueError("return value nested too deep")
    t = type(x)
    if x is None or t in (bool, int, float, str):
        return x
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        return str(x)
    if isinstance(x, list):
        return [_enc(v, depth + 1) for v in x]
    if isinstance(x, tuple):
        return {"t": [_enc(v, depth + 1) for v in x]}
    if isinstance(x, dict):
        return {"d": [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in x.items()]}
    if isinstance(x, frozenset):
        return {"fs": [_enc(v, depth + 1) for v in x]}
    if isinstance(x, set):
        return {"s": [_enc(v, depth + 1) for v in x]}
    if isinstance(x, (bytes, bytearray)):
        return {"b": bytes(x).hex()}
    if isinstance(x, complex):
        return {"c": [x.real, x.imag]}
    if type(x).__name__ == "module":
        return {"m": x.__name__}
    if hasattr(x, "tolist") and callable(x.tolist) and not callable(x):
        try:
            return _enc(x.tolist(), depth + 1)
        except Exception:
            pass
    return _handle(x)


def _dec(v):
    t = type(v)
    if v is None or t in (bool, int, float, str):
        return v
    if t is list:
        return [_dec(x) for x in v]
    (tag, body), = v.items()
    if tag == "t":
        return tuple(_dec(x) for x in body)
    if tag == "d":
        return {_dec(k): _dec(x) for k, x in body}
    if tag == "s":
        return {_dec(x) for x in body}
    if tag == "fs":
        return frozenset(_dec(x) for x in body)
    if tag == "b":
        return bytes.fromhex(body)
    if tag == "c":
        return complex(*body)
    if tag == "h":
        return _target(body[0] if type(body) is list else body)
    raise ValueError("bad value")


def _target(key):
    if isinstance(key, str):
        return _g[key]
    return _handles[key]


def _answer(req):
    op = req["op"]
    if op == "load":
        exec(compile(req["solution"], "solution.py", "exec"), _g)
        names = {}
        for k, v in list(_g.items()):
            if k.startswith("__"):
                continue
            if callable(v):
                names[k] = {"h": [k, True]}
            else:
                try:
                    names[k] = _enc(v)
                except Exception:
                    pass
        return {"names": names}
    target = _target(req["target"])
    if op == "call":
        args = [_dec(a) for a in req["args"]]
        kwargs = {k: _dec(v) for k, v in req["kwargs"].items()}
        return {"value": _enc(target(*args, **kwargs))}
    if op == "getattr":
        return {"value": _enc(getattr(target, req["name"]))}
    if op == "iter":
        return {"value": _enc(list(itertools.islice(iter(target), 1000000)))}
    if op == "len":
        return {"value": len(target)}
    raise ValueError("unknown op %r" % op)


for _line in _rin:
    _req = json.loads(_line)
    try:
        _rep = _answer(_req)
        _rep["ok"] = True
    except BaseException as _exc:
        if isinstance(_exc, KeyboardInterrupt):
            raise
        _rep = {"ok": False, "type": type(_exc).__name__,
                "error": "%s: %s" % (type(_exc).__name__, _exc)}
    _rep["id"] = _req["id"]
    try:
        _data = json.dumps(_rep)
    except Exception as _exc:
        _data = json.dumps({"ok": False, "id": _req["id"], "error": "unsendable reply: %s" % _exc})
    _rout.write(_data.encode() + b"\n")
    _rout.flush()
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
        "child": CHILD,
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
