"""A loopback TCP server for tests (tests/ is on sys.path: `from loopback import answering`)."""

from __future__ import annotations

import contextlib
import socket
import threading


@contextlib.contextmanager
def answering(reply: bytes):
    """A server on 127.0.0.1 that answers every connection with `reply` and closes it; yields HOST:PORT."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    done = threading.Event()

    def serve():
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    conn.recv(64)
                    conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        done.set()
        thread.join()
        srv.close()
