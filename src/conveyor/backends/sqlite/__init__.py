"""The SQLite backend (stdlib sqlite3): the embedded default."""

from conveyor.backends.sqlite.backend import SQLiteBackend

__all__ = ["SQLiteBackend"]
