"""Environment and policy YAML -> validated settings.

Every deployment setting comes from one ``FAVORITES_*`` environment variable; a policy's
settings come from its ``defs.yaml`` (which may read them from the environment). Both are
validated by :func:`parse_policy_settings`, where the bounds live. :func:`load_settings` is
called when the Dagster code location loads, so a bad value stops the load with a message that
names the variable and the value at fault, and no connection is ever opened with it. The database
password never appears in a message: URLs are shown with ``***`` in its place.

This module imports no Dagster: the command line uses it too. The retention core does not: the
defaults it owns are read from :mod:`favorites_maintenance.retention.defaults`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from urllib.parse import urlsplit, urlunsplit

import pydantic
from croniter import CroniterBadDateError, croniter
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from favorites_maintenance.retention.defaults import (
    DATABASE_URL_VAR,
    DEFAULT_MAX_PAUSE,
    DEFAULT_MAX_REPLICATION_LAG_BYTES,
)

RETENTION_DAYS_VAR = "FAVORITES_GUEST_RETENTION_DAYS"
BATCH_SIZE_VAR = "FAVORITES_GUEST_RETENTION_BATCH_SIZE"
CRON_VAR = "FAVORITES_GUEST_RETENTION_CRON"
MAX_RUN_DURATION_VAR = "FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION"
STALE_AFTER_VAR = "FAVORITES_GUEST_RETENTION_STALE_AFTER"
BATCH_SIZE_MAX_VAR = "FAVORITES_GUEST_RETENTION_BATCH_SIZE_MAX"
TARGET_BATCH_DURATION_VAR = "FAVORITES_GUEST_RETENTION_TARGET_BATCH_DURATION"
MAX_REPLICATION_LAG_BYTES_VAR = "FAVORITES_GUEST_RETENTION_MAX_REPLICATION_LAG_BYTES"
MAX_WAL_BYTES_PER_SECOND_VAR = "FAVORITES_GUEST_RETENTION_MAX_WAL_BYTES_PER_SECOND"
MAX_PAUSE_VAR = "FAVORITES_GUEST_RETENTION_MAX_PAUSE"
ALERT_WEBHOOK_URL_VAR = "FAVORITES_ALERT_WEBHOOK_URL"
METRICS_PUSHGATEWAY_URL_VAR = "FAVORITES_METRICS_PUSHGATEWAY_URL"

DEFAULT_RETENTION_DAYS = 365
DEFAULT_BATCH_SIZE = 1000
DEFAULT_CRON = "0 3 * * *"
DEFAULT_MAX_RUN_DURATION = dt.timedelta(minutes=10)
DEFAULT_STALE_AFTER = dt.timedelta(hours=48)
#: The largest batch the adaptive batch size may reach (never below the first batch's size).
DEFAULT_BATCH_SIZE_MAX = 10_000
#: Wall time one batch transaction aims at; 0 turns adaptation off (every batch the first size).
DEFAULT_TARGET_BATCH_DURATION = dt.timedelta(milliseconds=200)

# Upper bounds keep every value inside what the arithmetic and the database can hold, and inside
# what is sensible: a batch is one transaction holding row locks; a run is one daily tick.
MAX_RETENTION_DAYS = 36_500  # 100 years
MAX_BATCH_SIZE = 100_000
MIN_DURATION = dt.timedelta(seconds=1)
# Below the 1 h hard ceiling of run monitoring in dagster.yaml (max_runtime_seconds: 3600), which
# would otherwise end a long purge as FAILURE instead of letting it stop on its own budget.
MAX_RUN_DURATION_LIMIT = dt.timedelta(minutes=50)
MAX_STALE_AFTER = dt.timedelta(days=30)
# A batch aiming at more than this would sit near the batch's statement timeout (30 s).
MAX_TARGET_BATCH_DURATION = dt.timedelta(seconds=10)
MAX_LAG_BYTES = 2**40  # 1 TiB

# The favorites database is served through psycopg 3 (``postgresql+psycopg://``).
DRIVER = "postgresql+psycopg"
_ACCEPTED_DRIVERS = {"postgresql", "postgres", "postgresql+psycopg"}

_DURATION = pydantic.TypeAdapter(dt.timedelta)


class SettingsError(ValueError):
    """A setting is invalid. ``variable`` names the environment variable at fault (or, for a
    policy's YAML, ``policy P, field F``).

    The message names the variable and the bad value, except for database URLs, which are shown
    with the password masked, and malformed URLs, which are not echoed at all.
    """

    def __init__(self, variable: str, message: str):
        super().__init__(f"{variable}: {message}")
        self.variable = variable


@dataclass(frozen=True)
class PolicySettings:
    """The validated settings of one retention policy (every field has a default).

    Attributes:
        retention_days: retention period in days (> 0); a row idle longer is prunable.
        batch_size: rows of the first batch transaction (> 0).
        cron: 5-field cron expression of the schedule, evaluated in UTC.
        max_run_duration: wall-clock budget of one purge (> 0); past it the run stops gracefully.
        stale_after: how long without a successful run before the sensor alerts (> 0).
        batch_size_max: the largest batch the adaptive batch size may reach (>= batch_size).
        target_batch_duration: wall time a batch transaction aims at; zero turns adaptation
            off (every batch has ``batch_size`` rows).
        max_replication_lag_bytes: replication lag, in bytes of WAL, of a standby or a
            replication slot above which the purge pauses.
        max_wal_bytes_per_second: WAL written per second (the whole server) above which the
            purge pauses; ``None``: not watched.
        max_pause: how long the purge may stay paused before the run ends (``db_unhealthy``).
    """

    retention_days: int = DEFAULT_RETENTION_DAYS
    batch_size: int = DEFAULT_BATCH_SIZE
    cron: str = DEFAULT_CRON
    max_run_duration: dt.timedelta = DEFAULT_MAX_RUN_DURATION
    stale_after: dt.timedelta = DEFAULT_STALE_AFTER
    batch_size_max: int = DEFAULT_BATCH_SIZE_MAX
    target_batch_duration: dt.timedelta = DEFAULT_TARGET_BATCH_DURATION
    max_replication_lag_bytes: int = DEFAULT_MAX_REPLICATION_LAG_BYTES
    max_wal_bytes_per_second: int | None = None
    max_pause: dt.timedelta = DEFAULT_MAX_PAUSE

    def __post_init__(self):
        # Built directly (tests, scripts): a first batch above the default max raises the max.
        if self.batch_size_max < self.batch_size:
            object.__setattr__(self, "batch_size_max", self.batch_size)

    def policy_settings(self) -> "PolicySettings":
        """These settings as a plain :class:`PolicySettings` (without deployment fields)."""
        return PolicySettings(**{f.name: getattr(self, f.name) for f in fields(PolicySettings)})


@dataclass(frozen=True)
class Settings(PolicySettings):
    """The validated configuration of the deployment: the database, the alert webhook, and the
    settings of the guest-favorites policy (see :class:`PolicySettings`), all from
    ``FAVORITES_*`` variables.

    Attributes:
        database_url: SQLAlchemy URL of the favorites database, always with the
            ``postgresql+psycopg`` driver, or ``None`` when ``FAVORITES_DATABASE_URL`` is unset
            (the command line then starts the embedded server). Never log it: use
            :attr:`database_url_safe`.
        alert_webhook_url: optional Slack-compatible webhook for alerts.
        metrics_pushgateway_url: optional Prometheus Pushgateway every run pushes its gauges
            to (``http(s)://[user:password@]host[:port][/prefix]``); it may hold credentials,
            so never log it: use :func:`safe_http_url`.
    """

    database_url: URL | None = field(default=None, repr=False)
    alert_webhook_url: str | None = field(default=None, repr=False)
    metrics_pushgateway_url: str | None = field(default=None, repr=False)

    @property
    def database_url_safe(self) -> str | None:
        """The database URL with its password replaced by ``***``, fit for logs."""
        return None if self.database_url is None else safe_url(self.database_url)

    def require_database_url(self) -> URL:
        """Return :attr:`database_url`; raise :class:`SettingsError` when it is unset."""
        if self.database_url is None:
            raise SettingsError(DATABASE_URL_VAR, "is not set; give the SQLAlchemy URL of the "
                                "favorites database (postgresql+psycopg://user:password@host/db)")
        return self.database_url


#: The guest-favorites policy's variable of each :class:`PolicySettings` field.
GUEST_VARIABLES: dict[str, str] = {
    "retention_days": RETENTION_DAYS_VAR,
    "batch_size": BATCH_SIZE_VAR,
    "cron": CRON_VAR,
    "max_run_duration": MAX_RUN_DURATION_VAR,
    "stale_after": STALE_AFTER_VAR,
    "batch_size_max": BATCH_SIZE_MAX_VAR,
    "target_batch_duration": TARGET_BATCH_DURATION_VAR,
    "max_replication_lag_bytes": MAX_REPLICATION_LAG_BYTES_VAR,
    "max_wal_bytes_per_second": MAX_WAL_BYTES_PER_SECOND_VAR,
    "max_pause": MAX_PAUSE_VAR,
}


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the ``FAVORITES_*`` variables of ``environ`` (default ``os.environ``).

    An unset variable takes its default. A variable set to an empty or blank string is an error:
    an empty value is almost always a broken deployment template, not a wish for the default.

    Raises:
        SettingsError: the first invalid variable, named, with the value at fault.
    """
    if environ is None:
        import os

        environ = os.environ
    policy = parse_policy_settings(
        {name: environ.get(variable) for name, variable in GUEST_VARIABLES.items()},
        GUEST_VARIABLES)
    return Settings(
        **{f.name: getattr(policy, f.name) for f in fields(PolicySettings)},
        database_url=_opt(environ, DATABASE_URL_VAR, parse_database_url),
        alert_webhook_url=_opt(environ, ALERT_WEBHOOK_URL_VAR, _http_url),
        metrics_pushgateway_url=_opt(environ, METRICS_PUSHGATEWAY_URL_VAR, parse_pushgateway_url),
    )


def parse_policy_settings(values: Mapping[str, str | int | None],
                          labels: Mapping[str, str]) -> PolicySettings:
    """Validate one policy's settings, given as text (or whole numbers) by field name.

    This is where every bound lives: the environment (:func:`load_settings`) and a policy's
    YAML (``defs/<policy>/defs.yaml``) both come through here. A missing or ``None`` value
    takes the default; an empty or blank string is an error.

    Args:
        values: field name of :class:`PolicySettings` -> raw value.
        labels: field name -> what an error calls it (a variable, or ``policy P, field F``).

    Raises:
        SettingsError: the first invalid value, its label named, with the value at fault.
    """
    raw = {name: (None if value is None else str(value)) for name, value in values.items()}
    unknown = sorted(set(raw) - set(GUEST_VARIABLES))
    if unknown:
        raise ValueError(f"unknown policy settings {unknown!r}")

    def opt(name, parse, default=None):
        return _opt(raw, name, parse, default, label=labels.get(name, name))

    batch_size = opt("batch_size", _int_between(1, MAX_BATCH_SIZE), DEFAULT_BATCH_SIZE)
    batch_size_max = opt("batch_size_max", _int_between(1, MAX_BATCH_SIZE))
    if batch_size_max is None:
        batch_size_max = max(DEFAULT_BATCH_SIZE_MAX, batch_size)
    elif batch_size_max < batch_size:
        raise SettingsError(labels.get("batch_size_max", "batch_size_max"),
                            f"'{batch_size_max}' is below {labels.get('batch_size', 'batch_size')} "
                            f"({batch_size}), the first batch's size; the max must be at least "
                            "that")
    return PolicySettings(
        retention_days=opt("retention_days", _int_between(1, MAX_RETENTION_DAYS),
                           DEFAULT_RETENTION_DAYS),
        batch_size=batch_size,
        cron=opt("cron", validate_cron, DEFAULT_CRON),
        max_run_duration=opt("max_run_duration",
                             _duration_between(MIN_DURATION, MAX_RUN_DURATION_LIMIT),
                             DEFAULT_MAX_RUN_DURATION),
        stale_after=opt("stale_after", _duration_between(MIN_DURATION, MAX_STALE_AFTER),
                        DEFAULT_STALE_AFTER),
        batch_size_max=batch_size_max,
        target_batch_duration=opt("target_batch_duration",
                                  _duration_up_to(MAX_TARGET_BATCH_DURATION),
                                  DEFAULT_TARGET_BATCH_DURATION),
        max_replication_lag_bytes=opt("max_replication_lag_bytes",
                                      _int_between(1, MAX_LAG_BYTES),
                                      DEFAULT_MAX_REPLICATION_LAG_BYTES),
        max_wal_bytes_per_second=opt("max_wal_bytes_per_second", _int_between(1, MAX_LAG_BYTES)),
        max_pause=opt("max_pause", _duration_between(MIN_DURATION, MAX_RUN_DURATION_LIMIT),
                      DEFAULT_MAX_PAUSE),
    )


def _opt(values, key, parse, default=None, *, label=None):
    """Parse ``values[key]`` (``None``: ``default``); errors are raised under ``label``
    (default ``key``)."""
    label = label or key
    raw = values.get(key)
    if raw is None:
        return default
    if not raw.strip():
        raise SettingsError(label, "is set but empty; unset it to use the default"
                            if default is not None else "is set but empty")
    try:
        return parse(raw.strip())
    except SettingsError:
        raise
    except ValueError as exc:
        raise SettingsError(label, str(exc)) from None


def _int_between(low: int, high: int):
    def parse(raw: str) -> int:
        # ASCII digits only: int() would also take "1_000" and other scripts' digits.
        if not re.fullmatch(r"[+-]?[0-9]+", raw):
            raise ValueError(f"{raw!r} is not a whole number")
        value = int(raw)
        if value < low:
            raise ValueError(f"{raw!r} must be greater than 0" if low == 1
                             else f"{raw!r} must be at least {low}")
        if value > high:
            raise ValueError(f"{raw!r} must be at most {high:,}")
        return value

    return parse


def _duration_between(low: dt.timedelta, high: dt.timedelta):
    def parse(raw: str) -> dt.timedelta:
        value = parse_duration(raw)
        if value < low:
            raise ValueError(f"{raw!r} must be at least {_iso(low)}")
        if value > high:
            raise ValueError(f"{raw!r} must be at most {_iso(high)}")
        return value

    return parse


def _duration_up_to(high: dt.timedelta, low: dt.timedelta = dt.timedelta(milliseconds=10)):
    """A duration of zero (``PT0S``, ``00:00:00``: the feature is off), or from ``low`` to
    ``high``: a shorter one is more likely a typo than a wish."""
    def parse(raw: str) -> dt.timedelta:
        value = _read_duration(raw)
        if value < dt.timedelta(0) or raw.lstrip().startswith("-"):
            raise ValueError(f"{raw!r} must not be negative (PT0S turns it off)")
        if dt.timedelta(0) < value < low:
            raise ValueError(f"{raw!r} must be PT0S (off) or at least {_iso(low)}")
        if value > high:
            raise ValueError(f"{raw!r} must be at most {_iso(high)}")
        return value

    return parse


def validate_cron(raw: str) -> str:
    """Return ``raw`` if it is a cron expression Dagster's schedules accept, else raise.

    The rule is Dagster's own (``dagster._utils.schedules.is_valid_cron_string``, restated here
    so the core stays free of Dagster imports; a test checks that the two agree): croniter must
    parse it, it must expand to exactly 5 fields (no seconds field), and it must not name only
    the 30th or 31st of February. On top of it, an expression that never fires (``0 3 31 4 *``)
    is refused.

    Raises:
        ValueError: with the expression quoted.
    """
    expr = raw.strip()
    if not croniter.is_valid(expr):
        raise ValueError(f"{raw!r} is not a valid cron expression (5 fields, evaluated in UTC)")
    fields = croniter.expand(expr)[0]
    if len(fields) != 5:
        raise ValueError(f"{raw!r} has {len(fields)} fields; a schedule takes exactly 5 "
                         "(minute hour day-of-month month day-of-week)")
    days, months = fields[2], fields[3]
    if months == [2] and len(days) == 1 and days[0] in (30, 31):
        raise ValueError(f"{raw!r} never fires (February has no day {days[0]})")
    # Stricter than Dagster, which accepts e.g. "0 3 31 4 *": a schedule that never fires would
    # leave the table uncleaned with no error anywhere but the staleness alert.
    try:
        croniter(expr, dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)).get_next(dt.datetime)
    except CroniterBadDateError:
        raise ValueError(f"{raw!r} never fires (no such date)") from None
    return expr


def parse_duration(raw: str) -> dt.timedelta:
    """Parse a duration given as ``HH:MM:SS`` (hours unbounded) or ISO 8601 (``PT10M``).

    Returns:
        A positive :class:`datetime.timedelta`.

    Raises:
        ValueError: the text is neither form, or the duration is not greater than zero.
    """
    value = _read_duration(raw)
    if value <= dt.timedelta(0):
        raise ValueError(f"{raw!r} must be a duration greater than 0")
    return value


def _read_duration(raw: str) -> dt.timedelta:
    # pydantic reads both forms: HH:MM:SS with hours unbounded ("48:00:00") and ISO 8601.
    try:
        return _DURATION.validate_python(raw)
    except pydantic.ValidationError:
        raise ValueError(f"{raw!r} is not a duration; write HH:MM:SS (e.g. 00:10:00 or "
                         "00:00:00.2) or ISO 8601 (e.g. PT10M or PT0.2S)") from None


def _iso(value: dt.timedelta) -> str:
    """``value`` in ISO 8601, as the settings are written: ``PT50M``, ``PT0.01S``."""
    seconds = value.total_seconds()
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = "PT" + (f"{hours:g}H" if hours else "") + (f"{minutes:g}M" if minutes else "")
    return text + (f"{secs:g}S" if secs or text == "PT" else "")


def parse_database_url(raw: str) -> URL:
    """Parse a favorites database URL and pin the psycopg 3 driver.

    ``postgresql://`` and ``postgres://`` are taken to mean ``postgresql+psycopg://``.

    Driver options in the URL's query are checked as
    :func:`favorites_maintenance.retention.database.connect_options` takes them.

    Raises:
        SettingsError: malformed (the text is not echoed: it may hold a password), another
            driver or database (shown with the password masked), no database name, or a query
            option the driver cannot take (named).
    """
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):
        raise SettingsError(DATABASE_URL_VAR, "is not a valid SQLAlchemy URL; expected "
                            "postgresql+psycopg://user:password@host:port/database") from None
    if url.host and "@" in url.host:
        # "u:p@ss@host" parses as password "p" on host "ss@host": part of the password would
        # show wherever the host does.
        raise SettingsError(DATABASE_URL_VAR, "has an '@' in its host part; URL-encode an '@' "
                            "in the password as %40")
    if url.drivername not in _ACCEPTED_DRIVERS:
        raise SettingsError(DATABASE_URL_VAR, f"{safe_url(url)!r} uses driver "
                            f"{url.drivername!r}; expected {DRIVER!r}")
    if not url.database:
        raise SettingsError(DATABASE_URL_VAR, f"{safe_url(url)!r} names no database")
    # Driver options in the query are checked now, not when the first run connects.
    from favorites_maintenance.retention.database import connect_options
    from favorites_maintenance.retention.errors import ConnectOptionError

    try:
        connect_options(url)
    except ConnectOptionError as exc:
        raise SettingsError(DATABASE_URL_VAR, f"{safe_url(url)!r}: {exc}") from None
    return url.set(drivername=DRIVER)


def safe_url(url: URL) -> str:
    """``url`` as text with its password masked, in the user part and in the query
    (``?password=…``) alike."""
    # A libpq conninfo may hide in dbname (its own password with it): masked too.
    hidden = {k: "***" for k in url.query if "password" in k.lower() or k.lower() == "dbname"}
    text = url.update_query_dict(hidden).render_as_string(hide_password=True)
    return text.replace("%2A%2A%2A", "***")


def _http_url(raw: str) -> str:
    if not re.match(r"^https?://[^\s/]+", raw):
        raise ValueError("is not an http(s) URL")
    return raw


def parse_pushgateway_url(raw: str) -> str:
    """Check a Pushgateway URL, ``http(s)://[user:password@]host[:port][/path]``, and return it
    as given (credentials in it are sent as HTTP basic auth, see
    :mod:`favorites_maintenance.metrics`).

    Raises:
        SettingsError: under ``FAVORITES_METRICS_PUSHGATEWAY_URL``; the URL is shown without
            its user and password (see :func:`safe_http_url`), a malformed one not at all.
    """
    def refuse(problem: str) -> SettingsError:
        return SettingsError(METRICS_PUSHGATEWAY_URL_VAR, problem)

    try:
        parts = urlsplit(raw)
        parts.port  # a port that is not a number raises ValueError
    except ValueError:
        raise refuse("is not a valid URL; expected http(s)://host:9091") from None
    if not parts.netloc:
        # "user:password@host:9091" parses as a scheme and a path: echo nothing of it.
        raise refuse("is not an http(s) URL with a host; expected http(s)://host:9091")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise refuse(f"{safe_http_url(raw)!r} is not an http(s) URL with a host; expected "
                     "http(s)://host:9091")
    if parts.query or parts.fragment:
        # The client appends /metrics/job/... to the path: a query would end up mid-URL.
        raise refuse(f"{safe_http_url(raw)!r} has a query or fragment; give the gateway's base "
                     "URL only")
    return raw


def safe_http_url(raw: str) -> str:
    """``raw`` (an http(s) URL) without its user, password, query and fragment: fit for logs and
    messages. Text that is not a URL with a host comes back as ``<unparseable URL>``."""
    try:
        parts = urlsplit(raw)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    if not parts.netloc:
        return "<unparseable URL>"
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
