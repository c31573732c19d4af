"""The PostgreSQL backend (psycopg 3)."""

from conveyor.backends.postgres.backend import DEFAULT_SCHEMA, PostgresBackend

__all__ = ["DEFAULT_SCHEMA", "PostgresBackend"]
