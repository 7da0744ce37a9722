"""The study's database: Optuna's RDB storage with heartbeats, made safe for several SQLite workers, and the
refusals of a database that is not a study (:func:`make_storage`).

The default storage is the SQLite file ``OUTPUT/study.db``; ``--storage URL`` names any database SQLAlchemy reaches
(PostgreSQL for many machines). A file Optuna cannot read, or a SQLite database of another program (which Optuna
would take over, adding its tables beside the program's own), is refused in one line, the file left as it is.
"""
from __future__ import annotations

import contextlib
import sqlite3
import warnings
from pathlib import Path
from typing import Optional, Protocol

import optuna
import sqlalchemy
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback

from ..errors import ConfigError


class StorageOptions(Protocol):
    """What the storage needs of a search's settings (:class:`interlayer.search.mpt.SearchSettings` has it)."""

    storage: Optional[str]  # --storage; None: the default SQLite file
    output: Path
    heartbeat_seconds: int
    retry_lost: int

    @property
    def storage_url(self) -> str: ...

# Tables every Optuna storage holds (schema of Optuna 2 on): a SQLite file with tables but not these is another
# program's, which Optuna would otherwise take over, adding its tables beside the program's own
STUDY_TABLES = ("studies", "trials", "version_info")


def make_storage(settings: StorageOptions) -> RDBStorage:
    """An RDB storage with heartbeats: a RUNNING trial silent for 2 heartbeats turns FAIL (and is retried
    ``retry_lost`` times).

    SQLite ignores the row locks (``SELECT ... FOR UPDATE``) Optuna relies on, so two workers could pop the same
    queued trial; every SQLite transaction therefore starts with ``BEGIN IMMEDIATE`` (SQLAlchemy's recipe for
    serialisable pysqlite transactions), serialising the workers' short reads and writes, and waits up to a minute
    for the lock. PostgreSQL needs none of this.
    """
    url = settings.storage_url
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # the search prints its own lines; errors propagate
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # heartbeats are "experimental"
    sqlite = url.startswith("sqlite")
    if sqlite:
        check_study_file(settings)
    engine = {"connect_args": {"timeout": 60, "isolation_level": None}} if sqlite else {"pool_pre_ping": True}
    retry = RetryHeartbeatStaleTrialCallback(max_retry=settings.retry_lost) if settings.retry_lost else None
    try:
        storage = RDBStorage(url, engine_kwargs=engine, heartbeat_interval=settings.heartbeat_seconds,
                             grace_period=2 * settings.heartbeat_seconds, heartbeat_stale_trial_callback=retry)
    except ModuleNotFoundError as err:
        raise ConfigError(f"--storage {redact(url)} needs the database driver {err.name!r} (PostgreSQL: pip install "
                          "psycopg2-binary)") from err
    except Exception as err:  # sqlalchemy: bad URL, unreachable server, wrong password, a damaged file
        raise storage_error(settings, err) from err
    if sqlite:
        sqlalchemy.event.listen(storage.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
    return storage


def check_study_file(settings: StorageOptions) -> None:
    """Refuse a SQLite file that holds tables but not Optuna's (another program's database), read without
    changing it; a new, empty or unreadable file is left to the storage (which makes the tables, or names the
    damage: :func:`storage_error`)."""
    from sqlalchemy.engine import make_url

    try:
        path = Path(make_url(settings.storage_url).database or "")
    except Exception:  # not a URL SQLAlchemy reads: the storage names it (storage_error)
        return
    if not path.name or not path.is_file() or path.stat().st_size == 0:
        return
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError:
        return
    if tables and not set(STUDY_TABLES) <= tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise ConfigError(f"{path} is a SQLite database of another program (its tables: {shown}), not an Optuna "
                          f"study (tables {', '.join(STUDY_TABLES)}, ...); it is left as it is: give another "
                          f"{'--output' if settings.storage is None else '--storage'}")


def storage_error(settings: StorageOptions, err: Exception) -> ConfigError:
    """``err``, met opening the storage, in one line: the database's own complaint (SQLAlchemy wraps it with the
    SQL statement and a link), and for the default SQLite file what to do with it."""
    reason = getattr(err, "orig", None) or err  # the DBAPI error inside SQLAlchemy's
    text = " ".join(str(reason).split()) or type(reason).__name__
    if settings.storage is None:
        path = Path(settings.output) / "study.db"
        return ConfigError(f"{path} is not a readable study database ({text}); it is damaged or another program's: "
                           "move it away to start the search afresh (its trials are lost), or restore it from a copy")
    return ConfigError(f"--storage {redact(settings.storage_url)}: {type(reason).__name__}: {text}")


def redact(url: str) -> str:
    """The storage URL without its password (it goes into reports and logs)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL sqlalchemy understands: show the scheme only
        return url.split("://", 1)[0] + "://..."
