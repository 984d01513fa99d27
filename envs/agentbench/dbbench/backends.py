"""Database backends for dbbench: one fresh database per sample, on SQLite or MySQL/MariaDB.

Every column is created as TEXT, as AgentBench does, whatever type the data file names. A backend
makes :class:`DBSession` objects; a session loads the sample's table, runs the agent's SQL and
returns AgentBench-style observations, and computes the table hash for INSERT/UPDATE scoring.

* SQLite (embedded default): an in-memory database per sample; the hash is computed in Python from
  the table's rows (SQLite has no MD5), which reproduces MySQL's value.
* MySQL/MariaDB (``mysql://user:pass@host:port``): a database ``af_<random>`` per sample, dropped at
  the end, so concurrent samples with the same table name never meet. The connection uses utf8mb4
  and ``group_concat_max_len`` = 1024 (MySQL's default, under which ``answer_md5`` was computed); a
  reply that holds several statements runs them all, the first result is shown and every further
  result is consumed so the connection stays usable.
"""

from __future__ import annotations

import hashlib
import sqlite3
import unicodedata
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from astraflow.envs.agentbench.dbbench.scoring import (
    GROUP_CONCAT_MAX_LEN,
    format_rows,
    hash_answer,
    hash_query,
    quote_ident,
    table_hash,
    truncate_result,
)

from astraflow.errors import AstraFlowError


class BackendError(AstraFlowError, RuntimeError):
    """The database backend is unreachable or misconfigured."""


class DBSession(Protocol):
    def execute(self, sql: str) -> str:
        """Run the agent's SQL; the observation text (rows, or the error), truncated."""
        ...

    def table_hash(self) -> str:
        """AgentBench's table-hash result string, e.g. ``[('9df1...',)]``."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class TableSpec:
    name: str
    columns: list[str]
    rows: list[list[Any]]

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> TableSpec:
        return cls(payload["table_name"], list(payload["columns"]), list(payload["rows"]))


# --- SQLite -----------------------------------------------------------------------------------


class SQLiteSession:
    """An in-memory SQLite database made to behave like AgentBench's MySQL where it cheaply can.

    Text columns compare like MySQL's default ``utf8mb4_general_ci`` (case- and accent-insensitive,
    trailing spaces ignored), ``CONCAT``, ``CONCAT_WS``, ``MD5``, ``LEFT`` and ``RIGHT`` exist, and a
    reply with several statements runs them all (the first result is shown). What remains
    different: a TEXT column compared with a number compares as text in SQLite, numerically in
    MySQL; use the MySQL backend for exact semantics.
    """

    load_error: str | None = None

    def __init__(self, table: TableSpec):
        self.table = table
        self.conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        _install_mysql_compat(self.conn)
        cols = ", ".join(f"{_sqlite_ident(c)} TEXT COLLATE mysql_ci" for c in table.columns)
        self.conn.execute(f"CREATE TABLE {_sqlite_ident(table.name)} ({cols})")
        marks = ", ".join("?" for _ in table.columns)
        self.conn.executemany(
            f"INSERT INTO {_sqlite_ident(table.name)} VALUES ({marks})",
            [_fit(row, len(table.columns)) for row in table.rows],
        )

    def execute(self, sql: str) -> str:
        statements = _split_statements(sql) or [sql]
        try:
            cur = self.conn.execute(statements[0])
            rows = cur.fetchall() if cur.description is not None else []
            text = format_rows(rows)
        except (sqlite3.Error, ValueError, OverflowError) as exc:
            return truncate_result(str(exc))
        for extra in statements[1:]:  # like MySQL multi-statements: run, result not shown
            try:
                self.conn.execute(extra).fetchall()
            except (sqlite3.Error, ValueError, OverflowError):
                break
        return truncate_result(text)

    def table_hash(self) -> str:
        cols = ", ".join(_sqlite_ident(c) for c in self.table.columns)
        try:
            rows = self.conn.execute(f"SELECT {cols} FROM {_sqlite_ident(self.table.name)}")
            return hash_answer(table_hash(rows.fetchall()))
        except sqlite3.Error as exc:  # the agent dropped or broke the table
            return truncate_result(str(exc))

    def close(self) -> None:
        self.conn.close()


def _split_statements(sql: str) -> list[str]:
    """Split on statement-ending semicolons (quotes respected, via ``sqlite3.complete_statement``)."""
    out, buf = [], ""
    for ch in sql:
        buf += ch
        if ch == ";" and sqlite3.complete_statement(buf):
            if buf.strip(" ;\t\n"):
                out.append(buf.strip())
            buf = ""
    if buf.strip(" ;\t\n"):
        out.append(buf.strip())
    return out


def _ci_key(value: str) -> str:
    decomposed = unicodedata.normalize("NFKD", value)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold().rstrip(" ")


def _mysql_ci(a: str, b: str) -> int:
    ka, kb = _ci_key(a), _ci_key(b)
    return (ka > kb) - (ka < kb)


def _concat(*args: Any) -> str | None:
    return None if any(a is None for a in args) else "".join(_text(a) for a in args)


def _concat_ws(sep: Any, *args: Any) -> str | None:
    return None if sep is None else _text(sep).join(_text(a) for a in args if a is not None)


def _md5(value: Any) -> str | None:
    return None if value is None else hashlib.md5(_text(value).encode("utf-8")).hexdigest()


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _install_mysql_compat(conn: sqlite3.Connection) -> None:
    conn.create_collation("mysql_ci", _mysql_ci)
    conn.create_function("concat", -1, _concat, deterministic=True)
    conn.create_function("concat_ws", -1, _concat_ws, deterministic=True)
    conn.create_function("md5", 1, _md5, deterministic=True)
    conn.create_function(
        "left",
        2,
        lambda s, n: None if s is None else _text(s)[: max(int(n), 0)],
        deterministic=True,
    )
    conn.create_function(
        "right",
        2,
        lambda s, n: None if s is None or int(n) <= 0 else _text(s)[-int(n) :],
        deterministic=True,
    )


def _sqlite_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _fit(row: Sequence[Any], n: int) -> list[Any]:
    row = list(row)[:n]
    return row + [None] * (n - len(row))


@dataclass(frozen=True)
class SQLiteBackend:
    name: str = "sqlite"

    def open(self, table: TableSpec) -> SQLiteSession:
        return SQLiteSession(table)

    def describe(self) -> str:
        return f"sqlite {sqlite3.sqlite_version} (in-memory, hash in Python)"


# --- MySQL / MariaDB ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MySQLBackend:
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    password: str = ""
    name: str = "mysql"

    @classmethod
    def from_url(cls, url: str) -> MySQLBackend:
        parsed = urlparse(url)
        if parsed.scheme not in ("mysql", "mariadb"):
            raise BackendError(
                f"database URL must look like mysql://user:pass@host:port, got {url!r}"
            )
        return cls(
            host=parsed.hostname or "127.0.0.1",
            port=parsed.port or 3306,
            user=unquote(parsed.username or "root"),
            password=unquote(parsed.password or ""),
        )

    def connect(self):
        try:
            import pymysql
            from pymysql.constants import CLIENT
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise BackendError(
                "the MySQL backend needs pymysql: pip install 'astraflow[mysql]'"
            ) from exc
        try:
            conn = pymysql.connect(
                host=self.host,
                port=self.port,
                user=self.user,
                password=self.password,
                charset="utf8mb4",
                autocommit=True,
                client_flag=CLIENT.MULTI_STATEMENTS,
                connect_timeout=10,
            )
        except pymysql.MySQLError as exc:
            raise BackendError(
                f"cannot connect to MySQL/MariaDB at {self.user}@{self.host}:{self.port}: {exc}"
            ) from exc
        with conn.cursor() as cur:
            cur.execute(f"SET SESSION group_concat_max_len = {GROUP_CONCAT_MAX_LEN}")
        return conn

    def open(self, table: TableSpec) -> MySQLSession:
        return MySQLSession(self, table)

    def describe(self) -> str:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT VERSION()")
                (version,) = cur.fetchone()
        finally:
            conn.close()
        return f"mysql {version} at {self.host}:{self.port}"


class MySQLSession:
    def __init__(self, backend: MySQLBackend, table: TableSpec):
        self.table = table
        self.backend = backend
        self.database = f"af_{uuid.uuid4().hex[:16]}"
        self.conn = backend.connect()
        cols = ", ".join(f"{quote_ident(c)} TEXT" for c in table.columns)
        marks = ", ".join("%s" for _ in table.columns)
        #: Why the table could not be loaded (e.g. an empty column name, which MySQL refuses);
        #: like AgentBench, the episode still runs, against a database without the table.
        self.load_error: str | None = None
        try:
            self._load(cols, marks)
        except BaseException:
            self.close()  # never leave a half-made database behind
            raise

    def _load(self, cols: str, marks: str) -> None:
        import pymysql

        table = self.table
        with self.conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {quote_ident(self.database)} CHARACTER SET utf8mb4")
            cur.execute(f"USE {quote_ident(self.database)}")
            try:
                cur.execute(
                    f"CREATE TABLE {quote_ident(table.name)} ({cols}) CHARACTER SET utf8mb4"
                )
                if table.rows:
                    cur.executemany(
                        f"INSERT INTO {quote_ident(table.name)} VALUES ({marks})",
                        [_fit(row, len(table.columns)) for row in table.rows],
                    )
            except pymysql.MySQLError as exc:
                self.load_error = _mysql_error_text(exc)

    def _run(self, sql: str) -> list[tuple]:
        with self.conn.cursor() as cur:
            try:
                cur.execute(sql)
                rows = list(cur.fetchall()) if cur.description is not None else []
            finally:
                while True:  # consume every further result of a multi-statement reply
                    try:
                        if not cur.nextset():
                            break
                    except Exception:
                        break
        return rows

    def _ensure_connected(self) -> None:
        """A fresh connection when the last one died (e.g. the agent ran KILL or a long query)."""
        import pymysql

        try:
            self.conn.ping(False)
        except pymysql.MySQLError:
            try:
                self.conn.close()
            except Exception:
                pass
            self.conn = self.backend.connect()

    def execute(self, sql: str) -> str:
        import pymysql

        self._ensure_connected()
        try:
            with self.conn.cursor() as cur:
                cur.execute(f"USE {quote_ident(self.database)}")
            text = format_rows(self._run(sql))
        except pymysql.MySQLError as exc:
            text = _mysql_error_text(exc)
        return truncate_result(text)

    def table_hash(self) -> str:
        import pymysql

        try:
            self._ensure_connected()
            with self.conn.cursor() as cur:
                cur.execute(f"SET SESSION group_concat_max_len = {GROUP_CONCAT_MAX_LEN}")
                cur.execute(f"USE {quote_ident(self.database)}")
            return truncate_result(
                format_rows(self._run(hash_query(self.table.name, self.table.columns)))
            )
        except pymysql.MySQLError as exc:
            return truncate_result(_mysql_error_text(exc))

    def close(self) -> None:
        try:
            self._ensure_connected()
            with self.conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS {quote_ident(self.database)}")
        except Exception:
            pass
        finally:
            try:
                self.conn.close()
            except Exception:
                pass


def _mysql_error_text(exc: Exception) -> str:
    """``errno (SQLSTATE-less) : message`` like the MySQL client prints it."""
    args = getattr(exc, "args", ())
    if len(args) >= 2 and isinstance(args[0], int):
        return f"{args[0]}: {args[1]}"
    return str(exc)


def make_backend(db: str | None) -> SQLiteBackend | MySQLBackend:
    """``None``/``sqlite`` -> SQLite; ``mysql://...`` -> MySQL/MariaDB."""
    if db is None or db in ("sqlite", "sqlite://", ":memory:"):
        return SQLiteBackend()
    if db.startswith(("mysql://", "mariadb://")):
        return MySQLBackend.from_url(db)
    raise BackendError(f"--db must be 'sqlite' or a mysql://user:pass@host:port URL, got {db!r}")
