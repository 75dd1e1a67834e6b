#!/usr/bin/env python3
"""CPU time of running processes, by thread name, read from /proc.

    cpu_usage.py LABEL=PID...   prints one JSON object:
    {"LABEL": {"THREAD": {"user": SECONDS, "system": SECONDS}, ...}, ...}

Threads of one name (tokio's workers, say) are summed. The times are cumulative since each
thread started, so a process started just before the measured run is measured whole; a thread
that already exited is not counted (it is folded into no name).
"""
import json
import os
import sys

TICKS = os.sysconf("SC_CLK_TCK")


def threads(pid):
    by_name = {}
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue  # the thread ended while we looked
        # The name is in parentheses and may hold spaces; the fields after it are fixed.
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        user, system = int(fields[11]) / TICKS, int(fields[12]) / TICKS
        slot = by_name.setdefault(name, {"user": 0.0, "system": 0.0})
        slot["user"] += user
        slot["system"] += system
    return by_name


def main(args):
    out = {}
    for arg in args:
        label, _, pid = arg.partition("=")
        try:
            out[label] = threads(int(pid))
        except (OSError, ValueError) as error:
            print(f"cpu_usage: {arg}: {error}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
