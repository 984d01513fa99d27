"""AgentBench dbbench rules: reply parsing, result formatting, table hash and answer comparison.

Behaviour follows AgentBench v0.2 (``src/server/tasks/dbbench``):

* the action is the first ``Action: X`` followed by a newline; ``Operation`` runs the first
  ```` ```sql ```` block (newlines turned into spaces); anything else ends the episode and the answer is
  whatever follows the first ``\\nFinal Answer:``;
* a query's observation is ``str()`` of its rows as a list of tuples, or the error text, cut at 800
  characters followed by ``[TRUNCATED]``;
* INSERT/UPDATE/DELETE samples are scored by the table hash
  ``md5(group_concat(rowhash order by rowhash))`` with ``rowhash = substring(md5(concat_ws(',',
  cols)), 1, 5)``, rendered as the query result string and compared with ``answer_md5``;
* other samples: the answer is evaluated as a Python literal and turned into a list (a bare value
  becomes a one-element list of the raw text); one value against one label compares as numbers
  when both parse as floats, else as strings; otherwise the two are compared as sets.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

RESULT_LIMIT = 800
TRUNCATED = "[TRUNCATED]"
#: MySQL's default ``group_concat_max_len`` (the server that produced ``answer_md5``).
GROUP_CONCAT_MAX_LEN = 1024
MODIFYING_TYPES = ("INSERT", "DELETE", "UPDATE")

_ACTION = re.compile(r"Action: (.*?)\n")
_SQL_BLOCK = re.compile(r"```sql\n([\s\S]*?)\n```")
_FINAL = re.compile(r"\nFinal Answer:(.*)")


@dataclass(frozen=True)
class DBAction:
    kind: str  # "operation" | "answer"
    sql: str | None = None  # for operations; None when the reply has no ```sql block
    answer: str | None = None  # text after the first "\nFinal Answer:"; None when absent


def parse_reply(reply: str) -> DBAction:
    action = _ACTION.search(reply)
    final = _FINAL.search(reply)
    answer = final.group(1) if final else None
    if action and action.group(1) == "Operation":
        block = _SQL_BLOCK.search(reply)
        sql = block.group(1).strip().replace("\n", " ") if block else None
        return DBAction("operation", sql=sql, answer=answer)
    return DBAction("answer", answer=answer)


def format_rows(rows: Iterable[Sequence[Any]]) -> str:
    """Rows as AgentBench shows them: ``str`` of a list of tuples."""
    return str([tuple(r) for r in rows])


def truncate_result(text: str) -> str:
    return text[:RESULT_LIMIT] + TRUNCATED if len(text) > RESULT_LIMIT else text


def _concat_ws(values: Sequence[Any]) -> str:
    """MySQL's CONCAT_WS(',', ...): NULLs are skipped, everything else joined as text."""
    return ",".join(
        v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
        for v in values
        if v is not None
    )


def table_hash(rows: Iterable[Sequence[Any]]) -> str | None:
    """The table hash computed in Python, as MySQL computes it (None for an empty table)."""
    hashes = sorted(hashlib.md5(_concat_ws(r).encode("utf-8")).hexdigest()[:5] for r in rows)
    if not hashes:
        return None
    joined = ",".join(hashes)[:GROUP_CONCAT_MAX_LEN]
    return hashlib.md5(joined.encode("utf-8")).hexdigest()


def hash_query(table: str, columns: Sequence[str]) -> str:
    """The MySQL query AgentBench runs for the table hash (identifiers backtick-quoted)."""
    cols = ",".join(quote_ident(c) for c in columns)
    return (
        "select md5(group_concat(rowhash order by rowhash)) as hash from( SELECT "
        f"substring(MD5(CONCAT_WS(',', {cols})), 1, 5) AS rowhash FROM {quote_ident(table)}) as sub;"
    )


def quote_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def hash_answer(digest: str | None) -> str:
    """The hash as the string AgentBench compares with ``answer_md5``."""
    return format_rows([(digest,)])


def parse_answer_list(answer: str) -> list[Any]:
    try:
        value = ast.literal_eval(answer)
        return list(value)
    except Exception:
        return [answer]


def select_correct(answer: str, label: Sequence[Any]) -> bool:
    """AgentBench's comparison of a SELECT-type answer with its label list."""
    ans = parse_answer_list(answer)
    cor = list(label)
    if len(ans) == 1 and len(cor) == 1:
        try:
            return float(ans[0]) == float(cor[0])
        except (ValueError, TypeError):
            return ans[0] == cor[0]
    try:
        return set(ans) == set(cor)
    except TypeError:
        return False


def score(sample: dict[str, Any], answer: str) -> bool:
    """Whether ``answer`` (the final answer text, or the hash string for modifications) is right."""
    if sample["type"] in MODIFYING_TYPES:
        return answer == sample["answer_md5"]
    return select_correct(answer, sample["label"])
