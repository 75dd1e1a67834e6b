#!/usr/bin/env python3
"""The rate of durable commits this disk allows, as Herder's store makes them.

    fsync-limit.py [DIR] [COMMITS]

Opens a SQLite database in DIR (default: a fresh temporary folder) with the store's settings
(WAL journal, synchronous=FULL, exclusive locking) and times COMMITS (default 2,000)
transactions of one small row each, one after another. Prints one JSON line: the median and
p99 commit time, and the commits per second one writer can make. A submission in flight is
acknowledged only after its commit, so one connection with one submission in flight can never
go faster than that rate, and N such connections (whose submissions share commits) no faster
than N times it.
"""
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="herder-fsync-")
    commits = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    path = os.path.join(folder, "fsync-limit.sqlite3")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS log (idx INTEGER PRIMARY KEY, entry BLOB NOT NULL)")
    times = []
    row = b"x" * 200
    for i in range(commits):
        t0 = time.perf_counter()
        conn.execute("BEGIN")
        conn.execute("INSERT OR REPLACE INTO log (idx, entry) VALUES (?, ?)", (i, row))
        conn.execute("COMMIT")
        times.append(time.perf_counter() - t0)
    conn.close()
    os.remove(path)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    times.sort()
    median = statistics.median(times)
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    print(json.dumps({
        "commits": commits,
        "commit_millis_p50": round(median * 1000, 3),
        "commit_millis_p99": round(p99 * 1000, 3),
        "commits_per_second": round(1 / median),
    }))


if __name__ == "__main__":
    main()
