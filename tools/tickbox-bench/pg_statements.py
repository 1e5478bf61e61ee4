#!/usr/bin/env python3
"""Statements and WAL per message on PostgreSQL, from pg_stat_statements,
for one role's connections only (run the bench as a role nothing else uses,
so that other clients of the server do not count):

    pg_statements.py reset root
    bench --backend postgres --database-url postgres://root@127.0.0.1:5432/test \\
          --messages 10000 --concurrency 4 --only tickbox --no-trace
    pg_statements.py show root 10000

`show` prints the statements executed, the WAL records and WAL bytes, each
per message, and the statements that executed most. Needs the extension:
`shared_preload_libraries = 'pg_stat_statements'` (a restart) and
`CREATE EXTENSION pg_stat_statements` in the database the URL names. The
connection is made with psql, to $PGURL or postgres://postgres@127.0.0.1/test.
"""
import os
import subprocess
import sys

URL = os.environ.get("PGURL", "postgres://postgres@127.0.0.1:5432/test")


def psql(sql):
    """The rows `sql` returns, as lists of strings."""
    out = subprocess.run(["psql", URL, "-AtF", "\t", "-c", sql],
                         check=True, capture_output=True, text=True).stdout
    return [line.split("\t") for line in out.splitlines() if line]


def role_oid(role):
    rows = psql(f"SELECT oid FROM pg_roles WHERE rolname = '{role}'")
    if not rows:
        sys.exit(f"no role {role!r} on the server")
    return rows[0][0]


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "reset":
        psql(f"SELECT pg_stat_statements_reset({role_oid(sys.argv[2])})")
        return
    if len(sys.argv) == 4 and sys.argv[1] == "show":
        oid, messages = role_oid(sys.argv[2]), int(sys.argv[3])
        calls, records, wal = psql(
            "SELECT sum(calls), sum(wal_records), sum(wal_bytes) "
            f"FROM pg_stat_statements WHERE userid = {oid}")[0]
        print(f"statements per message: {int(calls) / messages:.2f}")
        print(f"WAL records per message: {int(records) / messages:.2f}")
        print(f"WAL bytes per message: {float(wal) / messages:.0f}")
        print("most executed (calls per message, WAL bytes per call, statement):")
        for calls, wal, query in psql(
                "SELECT calls, wal_bytes / calls, "
                "regexp_replace(left(query, 110), '\\s+', ' ', 'g') "
                f"FROM pg_stat_statements WHERE userid = {oid} "
                "ORDER BY calls DESC LIMIT 8"):
            print(f"  {int(calls) / messages:6.2f}  {float(wal):7.0f}  {query}")
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
