"""PostgreSQL's errors as conveyor's, by cause: the SQLSTATE decides, not
psycopg's class (``OperationalError`` holds a lost connection and a value
over an index's row limit alike).

:class:`~conveyor.errors.BackendUnavailableError` (the store cannot do it
now; the same call may pass later):

- a failed or lost connection, which psycopg raises without a SQLSTATE
  (``OperationalError``, ``InterfaceError``), and a pool that gave no
  connection in time;
- class 08 (connection exception), class 53 (insufficient resources: disk
  full, out of memory, too many connections), 57P01/57P02/57P03 (the server
  shuts down, crashed, or is starting), 57P05 (idle session timeout), 57014
  (statement cancelled or timed out), 55P03 (lock not available), 25P03
  (idle-in-transaction timeout), 58000/58030 (system or I/O error);
- 40001/40P01 (serialization failure, deadlock): the transaction was rolled
  back and a repeat may pass. An attempt's own transaction lets them through
  as they are instead: they are the handler's error (see ``transactions``).

:class:`~conveyor.errors.BackendError` (permanent: the same call fails
again, so do not repeat it): every other SQLSTATE, among them data (22),
integrity (23), program limits (54, e.g. an index row over its size
limit), syntax or access (42), a trigger's ``raise exception`` (P0001) and
internal errors (XX); and psycopg's own refusals without a SQLSTATE (a
value it cannot send or read).

A refusal of psycopg's own prepared statements (``_pg3_N`` already
exists, or does not) is the mark of a pooler in transaction mode that
conveyor was not told of: its message says to add ``pool_mode=transaction``
to the URL.

The message is one line: the primary message, the constraint or column if
the server named one, and the SQLSTATE; never the ``DETAIL`` (PostgreSQL
puts the whole failing row there) nor the ``CONTEXT`` (a trigger's SQL).
"""

from __future__ import annotations

import psycopg
from psycopg_pool import PoolTimeout

from conveyor.backends.refusals import one_line
from conveyor.errors import BackendError, BackendUnavailableError

UNAVAILABLE_CLASSES = frozenset({"08", "53"})
"""SQLSTATE classes of a store that cannot serve now."""
UNAVAILABLE_STATES = frozenset(
    {"57P01", "57P02", "57P03", "57P05", "57014", "55P03", "25P03", "58000", "58030"}
)
"""Single SQLSTATEs of a store that cannot serve now."""
ROLLED_BACK = frozenset({"40001", "40P01"})
"""Serialization failure and deadlock: the transaction was rolled back."""
PREPARED = frozenset({"42P05", "26000"})
"""A prepared statement that already exists, or does not."""
POOLER_HINT = (
    "; the URL may go through a pooler in transaction mode (PgBouncer's"
    " pool_mode = transaction): add pool_mode=transaction to it (docs/scaling.md)"
)


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the store cannot serve now (a repeat may pass),
    rather than that it refuses the statement for good."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:  # raised by psycopg, not by the server
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) and not (
            isinstance(exc, psycopg.errors.PipelineAborted)
        )
    return state[:2] in UNAVAILABLE_CLASSES or state in UNAVAILABLE_STATES or state in ROLLED_BACK


def rolled_back(exc: BaseException) -> bool:
    """Whether ``exc`` is a serialization failure or a deadlock."""
    return isinstance(exc, psycopg.Error) and exc.sqlstate in ROLLED_BACK


def translated(exc: BaseException) -> BackendError:
    """The conveyor error for ``exc`` (a psycopg error or a pool timeout),
    to raise ``from exc``."""
    if unavailable(exc):
        return BackendUnavailableError(f"PostgreSQL is unavailable: {one_line(str(exc))}")
    if isinstance(exc, psycopg.Error) and exc.sqlstate is not None:
        hint = POOLER_HINT if exc.sqlstate in PREPARED and "_pg3_" in str(exc) else ""
        return BackendError(f"PostgreSQL refused the statement: {refusal(exc)}{hint}")
    if isinstance(exc, psycopg.errors.PipelineAborted):
        return BackendError("PostgreSQL refused a statement of the batch")
    return BackendError(f"PostgreSQL cannot take or read a value: {one_line(str(exc))}")


def refusal(exc: psycopg.Error) -> str:
    """The server's refusal in one line: its primary message, what it names
    (constraint, column) that the message does not, and the SQLSTATE."""
    diag = exc.diag
    primary = diag.message_primary or str(exc).partition("\n")[0]
    text = one_line(primary)
    named = [
        f"{what} {value}"
        for what, value in (
            ("constraint", diag.constraint_name),
            ("column", diag.column_name),
        )
        if value and value not in text
    ]
    where = f" ({', '.join(one_line(n, 100) for n in named)})" if named else ""
    return f"{text}{where} [SQLSTATE {exc.sqlstate}]"
