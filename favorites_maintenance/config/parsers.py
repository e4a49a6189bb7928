"""Parsers of setting values given as text, and the error they raise.

A setting's value arrives as text: an environment variable, or a policy's ``defs.yaml`` read
as written (YAML 1.1 would read ``030`` as 24 and ``yes`` as 1). Every parser here takes that
text and returns the typed value or raises :class:`SettingsError` naming the setting (its
variable, or ``policy P, field F``) and the value at fault, except for URLs, which are shown
with their password masked, or not at all when malformed.

This module imports no Dagster: the command line and the core's callers use it too.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pydantic
from croniter import CroniterBadDateError, croniter
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from favorites_maintenance.retention.defaults import DATABASE_URL_VAR

#: The Prometheus Pushgateway every run pushes its gauges to (optional).
METRICS_PUSHGATEWAY_URL_VAR = "FAVORITES_METRICS_PUSHGATEWAY_URL"
#: The Slack-compatible webhook alerts are posted to (optional).
ALERT_WEBHOOK_URL_VAR = "FAVORITES_ALERT_WEBHOOK_URL"
#: The Dagster UI's base URL: a failed run's alert links to its page.
WEBSERVER_BASE_URL_VAR = "FAVORITES_WEBSERVER_BASE_URL"
#: How long a run's steps may go without a heartbeat before the run is taken for dead.
RUN_HEARTBEAT_TIMEOUT_VAR = "FAVORITES_RUN_HEARTBEAT_TIMEOUT"

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


def read_optional(values, key, parse, default=None, *, label=None):
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


def int_between(low: int, high: int):
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


def date_between(low: dt.date, high: dt.date):
    """A calendar day written ``YYYY-MM-DD``, from ``low`` to ``high``."""
    def parse(raw: str) -> dt.date:
        if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", raw):
            raise ValueError(f"{raw!r} is not a date; write YYYY-MM-DD")
        try:
            value = dt.date.fromisoformat(raw)
        except ValueError:
            raise ValueError(f"{raw!r} is not a date of the calendar") from None
        if not low <= value <= high:
            raise ValueError(f"{raw!r} must be from {low.isoformat()} to {high.isoformat()}")
        return value

    return parse


def _within(raw: str, value, low, high, show: Callable[[Any], str]):
    """``value`` (read from ``raw``) when ``low <= value <= high``; else ``ValueError`` naming
    the bound it passes, written by ``show``."""
    if value < low:
        raise ValueError(f"{raw!r} must be at least {show(low)}")
    if value > high:
        raise ValueError(f"{raw!r} must be at most {show(high)}")
    return value


def number_between(low: float, high: float):
    """A decimal number from ``low`` to ``high`` (``0.5``, ``2``; no exponent, no ``nan``)."""
    def parse(raw: str) -> float:
        if not re.fullmatch(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)", raw):
            raise ValueError(f"{raw!r} is not a decimal number")
        return _within(raw, float(raw), low, high, lambda bound: f"{bound:g}")

    return parse


def duration_between(low: dt.timedelta, high: dt.timedelta):
    def parse(raw: str) -> dt.timedelta:
        return _within(raw, parse_duration(raw), low, high, iso_duration)

    return parse


def duration_up_to(high: dt.timedelta, low: dt.timedelta = dt.timedelta(milliseconds=10)):
    """A duration of zero (``PT0S``, ``00:00:00``: the feature is off), or from ``low`` to
    ``high``: a shorter one is more likely a typo than a wish."""
    def parse(raw: str) -> dt.timedelta:
        value = _read_duration(raw)
        if value < dt.timedelta(0) or raw.lstrip().startswith("-"):
            raise ValueError(f"{raw!r} must not be negative (PT0S turns it off)")
        if dt.timedelta(0) < value < low:
            raise ValueError(f"{raw!r} must be PT0S (off) or at least {iso_duration(low)}")
        if value > high:
            raise ValueError(f"{raw!r} must be at most {iso_duration(high)}")
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


def iso_duration(value: dt.timedelta) -> str:
    """``value`` in ISO 8601, as the settings are written: ``PT50M``, ``PT0.01S``."""
    seconds = value.total_seconds()
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = "PT" + (f"{hours:g}H" if hours else "") + (f"{minutes:g}M" if minutes else "")
    return text + (f"{secs:g}S" if secs or text == "PT" else "")


def parse_database_url(raw: str, variable: str = DATABASE_URL_VAR) -> URL:
    """Parse the URL of a policy's database and pin the psycopg 3 driver.

    ``postgresql://`` and ``postgres://`` are taken to mean ``postgresql+psycopg://``.

    Driver options in the URL's query are checked as
    :func:`favorites_maintenance.retention.database.connect_options` takes them.

    Args:
        raw: the URL's text.
        variable: the environment variable it was read from, named by every error
            (``FAVORITES_DATABASE_URL`` unless the policy sets ``database_url_env``).

    Raises:
        SettingsError: under ``variable``: malformed (the text is not echoed: it may hold a
            password), another driver or database (shown with the password masked), no
            database name, or a query option the driver cannot take (named).
    """
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):
        raise SettingsError(variable, "is not a valid SQLAlchemy URL; expected "
                            "postgresql+psycopg://user:password@host:port/database") from None
    if url.host and "@" in url.host:
        # "u:p@ss@host" parses as password "p" on host "ss@host": part of the password would
        # show wherever the host does.
        raise SettingsError(variable, "has an '@' in its host part; URL-encode an '@' "
                            "in the password as %40")
    if url.drivername not in _ACCEPTED_DRIVERS:
        raise SettingsError(variable, f"{safe_url(url)!r} uses driver "
                            f"{url.drivername!r}; expected {DRIVER!r}")
    if not url.database:
        raise SettingsError(variable, f"{safe_url(url)!r} names no database")
    # Driver options in the query are checked now, not when the first run connects.
    from favorites_maintenance.retention.database import connect_options
    from favorites_maintenance.retention.errors import ConnectOptionError

    try:
        connect_options(url)
    except ConnectOptionError as exc:
        raise SettingsError(variable, f"{safe_url(url)!r}: {exc}") from None
    return url.set(drivername=DRIVER)


def safe_url(url: URL) -> str:
    """``url`` as text with its password masked, in the user part and in the query
    (``?password=…``) alike."""
    # A libpq conninfo may hide in dbname (its own password with it): masked too.
    hidden = {k: "***" for k in url.query if "password" in k.lower() or k.lower() == "dbname"}
    text = url.update_query_dict(hidden).render_as_string(hide_password=True)
    return text.replace("%2A%2A%2A", "***")


def http_url(raw: str) -> str:
    if not re.match(r"^https?://[^\s/]+", raw):
        raise ValueError("is not an http(s) URL")
    return raw


def parse_pushgateway_url(raw: str) -> str:
    """Check a Pushgateway URL, ``http(s)://[user:password@]host[:port][/path]``, and return it
    as given (credentials in it are sent as HTTP basic auth, see
    :mod:`favorites_maintenance.pipeline.metrics`).

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


def parse_webserver_base_url(raw: str) -> str:
    """Check the Dagster UI's base URL, ``http(s)://host[:port][/path]`` (what a browser
    opens), and return it without a trailing ``/``.

    Raises:
        SettingsError: under ``FAVORITES_WEBSERVER_BASE_URL``: not an http(s) URL with a host,
            or with a user or password (alerts show it), a query or a fragment.
    """
    def refuse(problem: str) -> SettingsError:
        return SettingsError(WEBSERVER_BASE_URL_VAR, problem)

    try:
        parts = urlsplit(raw)
        _ = parts.port  # a port that is not a number raises ValueError
    except ValueError:
        raise refuse("is not a valid URL; expected http(s)://host[:port]") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise refuse("is not an http(s) URL with a host; expected http(s)://host[:port]")
    if parts.username or parts.password:
        raise refuse(f"{safe_http_url(raw)!r} holds a user or password; alerts show this URL, "
                     "give it without them")
    if parts.query or parts.fragment:
        raise refuse(f"{safe_http_url(raw)!r} has a query or fragment; give the UI's base URL "
                     "only")
    return raw.rstrip("/")


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
