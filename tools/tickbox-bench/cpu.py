#!/usr/bin/env python3
"""CPU time between two readings: `cpu.py save`, run something, `cpu.py show`.

Per process name, sums utime + stime from /proc/<pid>/stat; only processes
alive at both readings count (short-lived ones, such as the bench itself and
the PostgreSQL backends of its connections, do not). The first line is the
whole machine's busy time from /proc/stat, which counts every process,
short-lived or not, and the kernel."""
import json
import os
import sys

STATE = '/tmp/tickbox-cpu.json'
HZ = os.sysconf('SC_CLK_TCK')


def machine():
    """Busy and idle jiffies of all CPUs (idle includes iowait)."""
    fields = [int(x) for x in open('/proc/stat').readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields[:8]) - idle, idle


def processes():
    found = {}
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            stat = open(f'/proc/{pid}/stat').read()
        except OSError:
            continue
        name = stat[stat.index('(') + 1:stat.rindex(')')]
        fields = stat[stat.rindex(')') + 2:].split()
        found[pid] = (name, int(fields[11]) + int(fields[12]))
    return found


if sys.argv[1:] == ['save']:
    json.dump({'machine': machine(), 'processes': processes()}, open(STATE, 'w'))
elif sys.argv[1:] == ['show']:
    before = json.load(open(STATE))
    busy, idle = machine()
    busy0, idle0 = before['machine']
    print(f"{'machine busy':20s} {(busy - busy0) / HZ:.2f}s (idle {(idle - idle0) / HZ:.2f}s)")
    totals = {}
    for pid, (name, ticks) in processes().items():
        ticks0 = before['processes'].get(pid, (name, 0))[1]
        if name.startswith('postgres'):
            name = 'postgres'
        totals[name] = totals.get(name, 0) + ticks - ticks0
    for name, ticks in sorted(totals.items(), key=lambda x: -x[1])[:8]:
        print(f"{name:20s} {ticks / HZ:.2f}s")
else:
    sys.exit('usage: cpu.py save | show')
