"""The one table-maker of the SQLite reader tests (test_nsys_fetch, test_sqlite_reader): a database of one table `t`."""

from __future__ import annotations
import sqlite3
from pathlib import Path


def make(path: Path, ddl: str, rows: list[tuple]) -> Path:
    db = sqlite3.connect(path)
    db.execute(ddl)
    if rows:
        db.executemany(f"INSERT INTO t VALUES ({', '.join('?' * len(rows[0]))})", rows)
    db.commit()
    db.close()
    return path

