"""A tiny SMTP server for the tests: it accepts every e-mail and appends its
Message-ID, one per line, to a file, flushed before it replies 250.

    python3 tests/support/smtp_sink.py OUT_FILE [PORT]

It listens on 127.0.0.1:PORT (0, the default, picks a free port) and prints
"ready PORT" on stdout once it listens. It stops when its stdin closes (the
test that started it ended, however it ended) or when it is killed. An
e-mail without a Message-ID is written as "-".

Needs aiosmtpd (python3 -m pip install aiosmtpd; .ci/run installs it).
"""

import asyncio
import email.parser
import os
import sys
import threading

try:
    from aiosmtpd.smtp import SMTP
except ImportError:
    sys.stderr.write(
        "the SMTP sink needs aiosmtpd: python3 -m pip install aiosmtpd "
        "(or set TICKBOX_PYTHON to a Python that has it)\n"
    )
    sys.exit(3)


class Sink:
    """Writes each accepted e-mail's Message-ID to `out`."""

    def __init__(self, out):
        self.out = out

    async def handle_DATA(self, server, session, envelope):
        headers = email.parser.BytesHeaderParser().parsebytes(envelope.content)
        message_id = (headers.get("Message-ID") or "-").strip()
        self.out.write(message_id + "\n")
        self.out.flush()
        return "250 OK queued as " + message_id


async def serve(path, port):
    with open(path, "a", encoding="utf-8") as out:
        loop = asyncio.get_running_loop()
        sink = Sink(out)
        server = await loop.create_server(lambda: SMTP(sink), "127.0.0.1", port)
        port = server.sockets[0].getsockname()[1]
        print(f"ready {port}", flush=True)
        stopped = asyncio.Event()
        # stdin closes when the test that started the sink ends.
        def watch_stdin():
            sys.stdin.read()
            loop.call_soon_threadsafe(stopped.set)

        threading.Thread(target=watch_stdin, daemon=True).start()
        await stopped.wait()
        server.close()


def main():
    if len(sys.argv) not in (2, 3):
        sys.stderr.write(__doc__)
        sys.exit(2)
    port = int(sys.argv[2]) if len(sys.argv) == 3 else 0
    asyncio.run(serve(sys.argv[1], port))
    os._exit(0)


if __name__ == "__main__":
    main()
