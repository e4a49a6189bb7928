"""The current instant of a run: the database server's clock, which wrote the rows' ages.

A rule compares its age column with ``now - retention``, and the ages were written by the
database server's clock (``now()`` in the application's ``INSERT`` or ``UPDATE``). A host whose
clock runs ahead of it (a VM cloned from a template, a host not yet synchronised by NTP) would
move the cutoff forward by as much and delete rows younger than the retention. So "now" is read
from the server (:func:`read_clock`), and this process's clock is only compared with it: a
difference of more than :data:`MAX_CLOCK_SKEW` is worth a warning, since the process's clock
still decides other things (which day a schedule runs, the times Dagster records).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from favorites_maintenance.retention.database import limit_transaction
from favorites_maintenance.retention.errors import ConnectError, describe

UTC = dt.UTC

#: A difference between this process's clock and the database server's above which a warning
#: is given.
MAX_CLOCK_SKEW = dt.timedelta(minutes=1)

#: The server's own clock when the statement runs (not the start of its transaction).
_SERVER_NOW = sa.select(sa.func.clock_timestamp())


def _process_now() -> dt.datetime:
    return dt.datetime.now(UTC)


@dataclass(frozen=True)
class ClockReading:
    """The database server's clock and this process's, read at the same moment.

    Attributes:
        database: the server's ``clock_timestamp()``, a UTC instant: the "now" of the run.
        process: this process's clock at the same moment (the middle of the round trip), UTC.
    """

    database: dt.datetime
    process: dt.datetime

    @property
    def skew(self) -> dt.timedelta:
        """How far this process's clock is ahead of the server's (negative: behind)."""
        return self.process - self.database

    @property
    def warning(self) -> str | None:
        """A sentence for the log when the two clocks differ by more than
        :data:`MAX_CLOCK_SKEW`, else ``None``."""
        if abs(self.skew) <= MAX_CLOCK_SKEW:
            return None
        way = "ahead of" if self.skew > dt.timedelta(0) else "behind"
        return (f"this host's clock ({self.process.isoformat(timespec='seconds')}) is "
                f"{_duration(abs(self.skew))} {way} the database server's "
                f"({self.database.isoformat(timespec='seconds')}): the cutoff follows the "
                f"database server's clock, which wrote the rows' ages; fix the host's time "
                f"synchronisation (NTP), which also decides which day the schedule runs")


def read_clock(database: sa.Engine | sa.Connection,
               process_clock: Callable[[], dt.datetime] = _process_now) -> ClockReading:
    """Read the database server's clock (one short read-only statement) and this process's.

    Args:
        database: engine on the database whose rows the rule ages (the statement runs in a
            transaction of its own, bounded like a batch), or a connection on it (the
            statement runs in its current transaction, which it begins if none is open).
        process_clock: this process's clock, timezone-aware (tests and the Dagster layer pass
            theirs).

    Returns:
        The :class:`ClockReading`; its ``database`` is the instant to compute a cutoff from.

    Raises:
        ConnectError: the server could not be reached or read (described without private
            data; ``transient`` for a lost or refused connection).
    """
    try:
        if isinstance(database, sa.Connection):
            before = process_clock()
            server = database.execute(_SERVER_NOW).scalar_one()
            after = process_clock()
        else:
            with database.connect() as conn, conn.begin():
                limit_transaction(conn)
                before = process_clock()
                server = conn.execute(_SERVER_NOW).scalar_one()
                after = process_clock()
    except sa.exc.DBAPIError as exc:
        raise ConnectError(describe(exc)) from None
    return ClockReading(database=server.astimezone(UTC),
                        process=(before + (after - before) / 2).astimezone(UTC))


def _duration(value: dt.timedelta) -> str:
    """``30 days 2 h``, ``5 min 3 s``: ``value`` in its two largest units, rounded to the
    smaller one."""
    seconds = value.total_seconds()
    for big, big_unit, small, small_unit in ((86400, "days", 3600, "h"), (3600, "h", 60, "min"),
                                             (60, "min", 1, "s")):
        if seconds >= big:
            smalls = round(seconds / small)
            count, rest = divmod(smalls, big // small)
            unit = "day" if big_unit == "days" and count == 1 else big_unit
            return f"{count} {unit} {rest} {small_unit}"
    return f"{seconds:.0f} s"
