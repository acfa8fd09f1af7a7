"""The seed's join over two PostgreSQL tables, and a concurrent workload on
them, for the CDC source tests (tests/connectors/test_postgres_cdc*.py).

    s1(id PRIMARY KEY, level)   s2(id PRIMARY KEY, attr)
    t1 = SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id

The workload runs transactions from several connections at once: inserts,
updates that move ``level`` (the join key), ``attr`` updates, deletes and
primary-key updates of both tables, several statements per transaction.
"""
from __future__ import annotations

import random
import threading

import psycopg

T1_COLS = ["id", "level", "attr"]
JOIN_SQL = "SELECT s1.id, s1.level, s2.attr FROM s1 JOIN s2 ON s1.level = s2.id ORDER BY s1.id"


def create_tables(conninfo: str, *, s2_identity_full: bool = True, s1_rows: int = 40,
                  s2_rows: int = 10) -> None:
    """Fresh s1/s2 with rows present before the first run (snapshot hand-over);
    s2 with ``REPLICA IDENTITY FULL`` (a retract stream), s1 with the default
    identity (an upsert stream)."""
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS s1, s2")
        c.execute("CREATE TABLE s1 (id bigint PRIMARY KEY, level bigint)")
        c.execute("CREATE TABLE s2 (id bigint PRIMARY KEY, attr text)")
        if s2_identity_full:
            c.execute("ALTER TABLE s2 REPLICA IDENTITY FULL")
        c.execute("INSERT INTO s2 SELECT g, 'a' || g FROM generate_series(1, %s) g", (s2_rows,))
        c.execute("INSERT INTO s1 SELECT g, 1 + g %% %s FROM generate_series(1, %s) g",
                  (s2_rows, s1_rows))


def drop_slots(conninfo: str) -> None:
    """Drop the replication slots of the test's database: the session's server
    has room for only a few (max_replication_slots), and a database with slots
    cannot be dropped."""
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                  "WHERE database = current_database() AND NOT active")


def expected_join(conninfo: str) -> list[tuple]:
    with psycopg.connect(conninfo) as c:
        return [tuple(r) for r in c.execute(JOIN_SQL).fetchall()]


class Workload:
    """``threads`` connections running random transactions until ``stop()``
    (or ``transactions`` each); ``committed`` counts them."""

    def __init__(self, conninfo: str, *, threads: int = 2, transactions: int = 200,
                 seed: int = 23, pause_s: float = 0.0):
        self.conninfo = conninfo
        self.transactions = transactions
        self.pause_s = pause_s
        self.committed = 0
        self.errors: list = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(seed + i, i), daemon=True)
                         for i in range(threads)]

    def start(self) -> "Workload":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.join()

    def join(self) -> None:
        for t in self._threads:
            t.join()
        if self.errors:
            raise self.errors[0]

    def _run(self, seed: int, worker: int) -> None:
        rnd = random.Random(seed)
        # fresh keys per worker: no two workers insert the same id
        next_id = [10_000 * (worker + 1)]
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as c:
                for _ in range(self.transactions):
                    if self._stop.is_set():
                        break
                    while True:
                        try:
                            with c.transaction():
                                for _ in range(rnd.randint(1, 4)):
                                    self._statement(c, rnd, next_id)
                            break
                        except (psycopg.errors.DeadlockDetected, psycopg.errors.UniqueViolation,
                                psycopg.errors.SerializationFailure):
                            continue
                    with self._lock:
                        self.committed += 1
                    if self.pause_s:
                        self._stop.wait(self.pause_s)
        except Exception as err:   # reported by join()
            self.errors.append(err)

    @staticmethod
    def _statement(c, rnd: random.Random, next_id: list) -> None:
        op = rnd.random()
        s2_ids = [r[0] for r in c.execute("SELECT id FROM s2").fetchall()] or [1]
        if op < 0.25:
            next_id[0] += 1
            c.execute("INSERT INTO s1 VALUES (%s, %s)", (next_id[0], rnd.choice(s2_ids)))
        elif op < 0.5:        # move the join key (the seed's level change)
            c.execute("UPDATE s1 SET level = %s WHERE id = (SELECT id FROM s1 ORDER BY random() "
                      "LIMIT 1)", (rnd.choice(s2_ids),))
        elif op < 0.6:
            c.execute("UPDATE s2 SET attr = attr || '+' WHERE id = %s", (rnd.choice(s2_ids),))
        elif op < 0.7:
            c.execute("DELETE FROM s1 WHERE id = (SELECT id FROM s1 ORDER BY random() LIMIT 1)")
        elif op < 0.8:        # primary-key update of s1
            next_id[0] += 1
            c.execute("UPDATE s1 SET id = %s WHERE id = (SELECT id FROM s1 ORDER BY random() "
                      "LIMIT 1)", (next_id[0],))
        elif op < 0.87:       # primary-key update of s2: its s1 rows lose (or find) a match
            next_id[0] += 1
            c.execute("UPDATE s2 SET id = %s WHERE id = %s", (next_id[0] % 50 + 1
                                                               if rnd.random() < 0.5 else next_id[0],
                                                               rnd.choice(s2_ids)))
        elif op < 0.93:
            c.execute("DELETE FROM s2 WHERE id = %s", (rnd.choice(s2_ids),))
        else:
            next_id[0] += 1
            c.execute("INSERT INTO s2 VALUES (%s, %s) ON CONFLICT (id) DO NOTHING",
                      (next_id[0] % 60 + 1, f"n{next_id[0]}"))
