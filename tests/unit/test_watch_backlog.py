"""What the tiles send while the host waits on calls (actors.watch.Watch.wait_all keeps it for the next
``listen``) reaches the host once, in order: a token twice would be a token too many in a client's answer, a
finish twice dropped a served request's last token (issue 33). Real sockets (a HostInbox and a tile's Outbox
over ipc), no Ray."""

from __future__ import annotations

import time

from waferrt.actors.stream import HostInbox, Outbox
from waferrt.actors.watch import Watch


def _token(out: Outbox, token: int) -> None:
    out.send("ev", e=1, ev=[[7, token, "", None]])


def _tokens(msgs: list[dict]) -> list[int]:
    return [ev[1] for m in msgs for ev in m["ev"]]


def test_messages_kept_while_waiting_on_calls_are_listened_to_once_in_order(tmp_path):
    inbox = HostInbox(str(tmp_path))
    out = Outbox(inbox.addresses["ipc"], "tile(0,0)")
    try:
        watch = Watch({}, inbox, 4.0)
        _token(out, 1)
        _token(out, 2)
        end = time.monotonic() + 10
        while len(watch.backlog) < 2 and time.monotonic() < end:  # two slices of a wait on calls
            watch.keep_for_later()
            time.sleep(0.01)
        _token(out, 3)
        time.sleep(0.2)
        watch.keep_for_later()
        assert _tokens(watch.listen(1.0)) == [1, 2, 3]
        assert watch.listen(0.05) == [] and watch.backlog == []
    finally:
        out.close()
        inbox.close()
