"""Simulated user sessions writing to the favorites table while purges run.

Each writer thread owns its share of the target rows (every ``writers``-th one, from position
``n``), so the last value it wrote to a row is the row's final value: the test can then check
row by row that every write that reported success survived, and that every row a purge deleted
was prunable.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from dataclasses import dataclass, field

import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import dev_favorites
from favorites_maintenance.retention.database import create_engine

UTC = dt.timezone.utc
f = dev_favorites.c


@dataclass
class Writes:
    """What the user sessions did, as they saw it."""

    claimed: dict[int, int] = field(default_factory=dict)      # id -> user_id, write succeeded
    touched: dict[int, str] = field(default_factory=dict)      # id -> note, write succeeded
    inserted: set[int] = field(default_factory=set)
    found_gone: set[int] = field(default_factory=set)          # a write hit 0 rows: deleted
    held: int = 0                                              # lock-and-release transactions
    latencies_s: list[float] = field(default_factory=list)     # writes only, not holds
    errors: list[BaseException] = field(default_factory=list)

    @property
    def count(self) -> int:
        """Write transactions that committed (claims, touches, inserts; holds excluded)."""
        return len(self.latencies_s)

    def percentile_ms(self, p: float) -> float:
        ordered = sorted(self.latencies_s)
        if not ordered:
            return 0.0
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000

    def merge(self, other: "Writes") -> None:
        self.claimed.update(other.claimed)
        self.touched.update(other.touched)
        self.inserted |= other.inserted
        self.found_gone |= other.found_gone
        self.held += other.held
        self.latencies_s += other.latencies_s
        self.errors += other.errors


def _writer(url, n: int, writers: int, targets: list[int], stop: threading.Event,
            out: Writes, seed: int, hold_s: float) -> None:
    rng = random.Random(seed)
    mine = list(targets[n::writers])
    engine = create_engine(url, application_name="favorites-user-session", pool_size=1)
    try:
        while not stop.is_set():
            op = rng.random()
            row_id = rng.choice(mine) if mine else None
            t0 = time.monotonic()
            try:
                with engine.begin() as conn:
                    if op < 0.3 and row_id is not None:  # a guest signs in: the row is claimed
                        user = rng.randrange(1, 10**6)
                        got = conn.execute(sa.update(dev_favorites).where(f.id == row_id)
                                           .values(user_id=user).returning(f.id)).first()
                        if got:
                            out.claimed[row_id] = user
                        else:
                            out.found_gone.add(row_id)
                    elif op < 0.6 and row_id is not None:  # the guest comes back: touched
                        note = f"touched-{n}-{rng.randrange(10**9)}"
                        got = conn.execute(sa.update(dev_favorites).where(f.id == row_id)
                                           .values(note=note, updated_at=sa.func.now())
                                           .returning(f.id)).first()
                        if got:
                            out.touched[row_id] = note
                        else:
                            out.found_gone.add(row_id)
                    elif op < 0.8 and row_id is not None:  # a long user transaction holds a row
                        conn.execute(sa.select(f.id).where(f.id == row_id).with_for_update())
                        time.sleep(hold_s)
                        out.held += 1
                        t0 = None
                    else:  # a new guest favorite
                        out.inserted.add(conn.execute(
                            sa.insert(dev_favorites).returning(f.id),
                            {"anonymous_id": "00000000-0000-4000-8000-00000000beef",
                             "item_id": rng.randrange(10**6), "user_id": None,
                             "note": None}).scalar_one())
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                out.errors.append(exc)
                return
            if t0 is not None:
                out.latencies_s.append(time.monotonic() - t0)
    finally:
        engine.dispose()


class UserSessions:
    """``writers`` threads writing to ``targets`` (ids) until :meth:`stop`."""

    def __init__(self, url, targets: list[int], *, writers: int = 4, seed: int = 5,
                 hold_s: float = 0.02):
        self._stop = threading.Event()
        self._outs = [Writes() for _ in range(writers)]
        self._threads = [
            threading.Thread(target=_writer, daemon=True,
                             args=(url, n, writers, targets, self._stop, self._outs[n],
                                   seed + n, hold_s))
            for n in range(writers)]

    def __enter__(self) -> "UserSessions":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> Writes:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        total = Writes()
        for out in self._outs:
            total.merge(out)
        return total


def final_state(engine) -> dict[int, tuple]:
    """id -> (user_id, note, updated_at) of every row."""
    with engine.connect() as conn:
        return {r.id: (r.user_id, r.note, r.updated_at) for r in conn.execute(
            sa.select(f.id, f.user_id, f.note, f.updated_at))}


def assert_exactly_the_prunable_rows_are_gone(state: dict, writes: Writes, *, kept: set[int],
                                              prunable: set[int], cutoff: dt.datetime) -> None:
    """Row by row: every successful write survived with its value, everything else prunable
    is gone, and nothing else is missing."""
    survivors = kept | writes.inserted | set(writes.claimed) | set(writes.touched)
    assert set(state) == survivors, (
        f"missing {len(survivors - set(state))} rows, "
        f"{len(set(state) - survivors)} rows that should be gone")
    for row_id, user in writes.claimed.items():
        assert state[row_id][0] == user, row_id
    for row_id, note in writes.touched.items():
        assert state[row_id][1] == note, row_id
        assert state[row_id][2] >= cutoff, row_id
    gone = set(prunable) - set(state)
    assert writes.found_gone <= gone
    assert gone == set(prunable) - set(writes.claimed) - set(writes.touched)
