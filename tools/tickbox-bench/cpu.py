#!/usr/bin/env python3
"""CPU time per process name between two readings: `cpu.py save`, run something, `cpu.py show`.

Sums utime + stime from /proc/<pid>/stat; only processes alive at both readings count."""
import json
import os
import sys

STATE = '/tmp/tickbox-cpu.json'
def snap():
    d={}
    for p in os.listdir('/proc'):
        if not p.isdigit(): continue
        try:
            s=open(f'/proc/{p}/stat').read()
        except: continue
        name=s[s.index('(')+1:s.rindex(')')]
        f=s[s.rindex(')')+2:].split()
        t=int(f[11])+int(f[12])
        d[p]=(name,t)
    return d
if sys.argv[1]=='save':
    json.dump(snap(),open(STATE,'w'))
else:
    a=json.load(open(STATE)); b=snap(); tot={}
    for p,(n,t) in b.items():
        t0=a.get(p,(n,0))[1]
        if n.startswith('postgres'): n='postgres'
        tot[n]=tot.get(n,0)+t-t0
    for n,t in sorted(tot.items(),key=lambda x:-x[1])[:8]: print(f"{n:20s} {t/100:.2f}s")
