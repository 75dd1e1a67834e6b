#!/usr/bin/env python3
"""Runs one `herder bench --json` and prints its JSON line with where the CPU went.

    bench-run.py TOPOLOGY RUN LABEL=PID... -- BENCH COMMAND...

Adds "topology", "run" and "cpu_per_1000_jobs": CPU-seconds per 1,000 accepted jobs of the
load generator (its whole process, from the kernel's account of a finished child) and of
each running process named by LABEL=PID, read from /proc as soon as the bench ends. A
coordinator's share is split into its store thread ("store": SQLite and fsync) and the rest
("driver": the tokio threads, the log writer). Each figure is user plus kernel time, with
the kernel's part given too: {"total": S, "kernel": S}.
"""
import json
import os
import resource
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_usage  # noqa: E402


def share(threads, names=None, exclude=()):
    user = system = 0.0
    for name, t in threads.items():
        if (names is None or name in names) and name not in exclude:
            user += t["user"]
            system += t["system"]
    return user, system


def main():
    split = sys.argv.index("--")
    topology, run, *roles = sys.argv[1:split]
    command = sys.argv[split + 1 :]
    bench = subprocess.run(command, stdout=subprocess.PIPE, check=False)
    ended = {}
    for role in roles:
        label, _, pid = role.partition("=")
        try:
            ended[label] = cpu_usage.threads(int(pid))
        except OSError:
            pass  # the process already exited: nothing to read
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        row = json.loads(bench.stdout)
    except json.JSONDecodeError:
        sys.stdout.write(bench.stdout.decode(errors="replace"))
        sys.exit(bench.returncode or 1)
    per = 1000.0 / max(row.get("accepted", 0), 1)

    def figure(user, system):
        return {"total": round((user + system) * per, 4), "kernel": round(system * per, 4)}

    cpu = {"load_generator": figure(child.ru_utime, child.ru_stime)}
    workers = [0.0, 0.0]
    for label, threads in sorted(ended.items()):
        if label.startswith("worker"):
            u, s = share(threads)
            workers[0] += u
            workers[1] += s
            continue
        cpu[f"{label}.store"] = figure(*share(threads, names={"herder-store"}))
        cpu[f"{label}.driver"] = figure(*share(threads, exclude={"herder-store"}))
    if any(label.startswith("worker") for label in ended):
        cpu["workers"] = figure(*workers)
    total_user = child.ru_utime + sum(share(t)[0] for t in ended.values())
    total_system = child.ru_stime + sum(share(t)[1] for t in ended.values())
    cpu["all"] = figure(total_user, total_system)
    print(json.dumps({"topology": topology, "run": int(run), **row, "cpu_per_1000_jobs": cpu}))
    sys.exit(bench.returncode)


if __name__ == "__main__":
    main()
