"""Where studies live: Optuna's own storages, opened from a URL or a journal file path.

An RDB URL (`sqlite:///file.db`, `postgresql+psycopg://user:pw@host/db`, any SQLAlchemy URL) opens an
RDBStorage with a heartbeat: a trial whose worker stops beating (killed, machine lost) for twice the
interval is failed by the next worker to start a trial, and RetryHeartbeatStaleTrialCallback enqueues it
again with the same parameters. Anything else is a journal file (JournalFileBackend, file locks), the
form optuna-dashboard also takes; it has no heartbeat.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna
import sqlalchemy
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend

from specbench.core.errors import SpecbenchError

MAX_RETRY = 3  # a trial whose workers keep dying is not retried forever


def default_storage(out: str | Path) -> str:
    """The SQLite file under <out>/tuning/ that holds every study unless --storage says otherwise (created
    with the first study: see local_file)."""
    return f"sqlite:///{Path(out) / 'tuning' / 'studies.db'}"


def is_rdb(url: str) -> bool:
    return "://" in url


def local_file(url: str) -> Path | None:
    """The file a journal path or a SQLite URL names, which opening the storage creates; None for a server."""
    if not is_rdb(url):
        return Path(url)
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return None  # open_storage says what is wrong with it
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def display_url(url: str) -> str:
    """The URL with any password hidden, for messages and outputs."""
    if not is_rdb(url):
        return url
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return url


def open_storage(url: str, heartbeat_s: int) -> BaseStorage:
    """The storage behind `url`; one clear line when it cannot be opened."""
    where = display_url(url)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if not is_rdb(url):
            path = Path(url)
            if path.is_dir() or not path.parent.is_dir():
                raise SpecbenchError(f"cannot open storage {where}: a journal file needs an existing directory")
            try:
                return JournalStorage(JournalFileBackend(str(path)))
            except OSError as exc:
                raise SpecbenchError(f"cannot open storage {where}: {exc}") from None
        sqlite = url.startswith("sqlite")
        try:
            return RDBStorage(
                url,
                # SQLite: wait for another worker's write lock rather than fail; servers: drop dead connections
                engine_kwargs={"connect_args": {"timeout": 60}} if sqlite else {"pool_pre_ping": True},
                heartbeat_interval=heartbeat_s, grace_period=2 * heartbeat_s,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY),
            )
        except ImportError as exc:
            raise SpecbenchError(f"cannot open storage {where}: {exc.name or exc} is not installed "
                                 "(for PostgreSQL: pip install 'specbench[distributed]')") from None
        except (sqlalchemy.exc.SQLAlchemyError, ValueError) as exc:
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            raise SpecbenchError(f"cannot open storage {where}: {reason}") from None
