"""The wafer's decode kept running in a thread of the driver, fed requests one by one by the HTTP server.

Contract: a :class:`Runner` owns an opened, loaded WaferLLM's decode (``WaferLLM.decoder()``); only its thread
talks to the tiles. ``submit(job) -> request number`` hands a :class:`Job` over (raises :class:`Busy` when
``slots + max_queued`` requests are already in, :class:`Down` when the wafer cannot serve); ``cancel(rid)``
stops one (a client that went away: the head frees its K/V slot when its tokens in flight come back);
``inject(fault)`` arms a fault from any thread. The thread starts the tiles' loops when a request comes and
stops them when none is left (a *session*: the stage runs it booked give the modelled times, read while it
runs: ``runs_so_far``, no Ray call per token); it hands each request's tokens to ``job.deliver`` as they
come (an :class:`Update`; the last one carries its finish and its modelled times, waferrt.serving.modelled,
worked out and delivered by a second thread so that the runner's keeps delivering the other requests' tokens).
A fault that ends an attempt is repaired (waferrt.serving.host.repair) and every unfinished request resumed
where it was (waferrt.serving.recovery.resumed), so its tokens are those of a run without the fault; what
cannot be recovered ends every open request with ``finish="error: ..."`` and the runner stays down.
A server request samples with ``default_rng([seed, 0])`` (Submission.rng_index 0): as the same request
decoded alone by ``waferrt generate``. ``health`` is "ok", "recovering" or "down: <why>"; ``state()`` is a
snapshot of the requests and the faults (waferrt.server.state draws the mesh); ``take_recent_runs()`` the stage
runs read since it last looked (the live heatmap's: kept, and read every READ_S, only while someone looks).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from waferrt.decode.schedule import flow_schedule
from waferrt.faults.errors import FaultStop, Unrecoverable
from waferrt.model.sampling import Sampler
from waferrt.serving.engine import Submission
from waferrt.serving.host import WAIT_S, repair
from waferrt.serving.modelled import ModelledTimes, request_times
from waferrt.serving.recovery import resumed
from waferrt.serving.requests import GenRequest

STOP_S = 60.0  # how long stop() waits for the thread to end the session and return
IDLE_S = 0.01  # how long the idle thread waits for a new request before looking at its flags again
READ_S = 0.5  # how often a running session's stage runs are read for the live heatmap (a Ray call per tile)
WATCHED_S = 5.0  # ... while the live state was asked for this recently (else only when requests finish: no
# Ray calls into the busy tiles and no runs kept for a page that nobody watches)


class Busy(Exception):
    """The waiting queue is full: come back later (HTTP 429 with Retry-After)."""


class Down(Exception):
    """The wafer cannot serve (a fault it could not recover from, or the server is stopping): HTTP 503."""


@dataclass(frozen=True, eq=False)
class Update:
    token: int  # -1: none (the request ended without one)
    finish: str = ""  # "" while it goes on; "stop", "length", "cancelled", "error: <why>"
    modelled: ModelledTimes | None = None  # with the last update
    queued_s: float | None = None  # with the last update: from its arrival until the head's tile had it


@dataclass(frozen=True, eq=False)
class Job:
    request: GenRequest
    sampler: Sampler
    deliver: Callable[[Update], None]  # called in the runner's thread, for each token and at the end
    arrived: float = 0.0  # time.perf_counter() when it arrived


@dataclass
class _Live:
    job: Job
    sub: Submission
    tokens: list[int] = field(default_factory=list)
    arrived: float = field(default_factory=time.time)
    first_at: float | None = None
    handed: float = field(default_factory=time.perf_counter)  # when the head's tile got it
    cancelled: bool = False


class Runner:
    def __init__(self, llm, max_queued: int):
        self.llm, self.decode = llm, llm.decoder()
        self.slots, self.max_queued = llm.setup.slots, max_queued
        self.health = "ok"
        self.live: dict[int, _Live] = {}  # request number -> what it has produced (the runner's thread writes)
        self.lock = threading.Lock()  # guards live (read by state()) and the counters below
        self.inbox: queue.Queue = queue.Queue()  # ("job", rid, Job) / ("cancel", rid) / ("inject", fault, reply)
        self.next_rid, self.taken = 0, 0
        self.session, self.since, self.runs = False, {}, []  # the tiles' loops running; stage runs read so far
        self.recent_runs: list = []  # the runs read since state() last looked (the live heatmap's)
        self.read_at = 0.0  # when the runs were last read (time.monotonic())
        self.watched_at = -WATCHED_S  # when the live state last took the recent runs (time.monotonic())
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="waferrt-runner")
        self.finals: queue.Queue = queue.Queue()  # (stage runs, [(_Live, last token, finish)]) / None: stop
        self.timer = threading.Thread(target=self._time_finals, daemon=True, name="waferrt-modelled")

    def start(self) -> Runner:
        self.thread.start()
        self.timer.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(STOP_S)
        self.finals.put(None)
        self.timer.join(STOP_S)

    # -- from the server's threads -------------------------------------------------------------------------
    def submit(self, job: Job) -> int:
        with self.lock:
            if self.health.startswith("down") or self.stopping.is_set():
                raise Down(self.health if self.health.startswith("down") else "down: the server is stopping")
            if self.taken >= self.slots + self.max_queued:
                raise Busy(f"{self.taken} requests are in (at most {self.slots} running and --max-queued "
                           f"{self.max_queued} waiting)")
            rid, self.next_rid, self.taken = self.next_rid, self.next_rid + 1, self.taken + 1
        self.inbox.put(("job", rid, job))
        return rid

    def cancel(self, rid: int) -> None:
        self.inbox.put(("cancel", rid, None))

    def inject(self, fault, timeout: float = 30.0) -> int:
        """Arm `fault` on the tiles (from the runner's thread): its index in the fault log."""
        reply: queue.Queue = queue.Queue()
        self.inbox.put(("inject", fault, reply))
        got = reply.get(timeout=timeout)
        if isinstance(got, BaseException):
            raise got
        return got

    @property
    def counts(self) -> tuple[int, int]:
        """(running, waiting): requests in the tiles' K/V slots (at most slots), and the rest that are in."""
        with self.lock:
            return min(self.taken, self.slots), max(0, self.taken - self.slots)

    def fault_log(self) -> list:
        return list(self.decode.log.events)

    # -- the runner's thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    self._turn()
                except (Unrecoverable, FaultStop):
                    raise
                except Exception as e:  # noqa: BLE001 - a fault (a call to a tile, the events): repair, resume
                    self._recover(e)
        except BaseException as e:  # noqa: BLE001 - the wafer cannot serve any more: every open request ends
            self._down(f"down: {type(e).__name__}: {e}")
        finally:
            if self.session:
                try:
                    self._end_session()
                except Exception:  # noqa: BLE001 - a failed wafer cannot end its loops; closing it ends them
                    pass

    def _turn(self) -> None:
        self._take(block=not self.live)
        if self.live:
            self._step()
        elif self.session:
            self._end_session()

    def _take(self, block: bool) -> None:
        try:
            msg = self.inbox.get(timeout=IDLE_S) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*msg)
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, verb: str, arg, extra) -> None:
        if verb == "inject":
            try:
                extra.put(self.decode.inject(arg))
            except Exception as e:  # noqa: BLE001 - handed back to the caller's thread
                extra.put(e)
        elif verb == "cancel":
            if arg in self.live and self.session:
                self.live[arg].cancelled = True
                self.decode.cancel(arg)
        else:
            sub = Submission(arg, extra.request, extra.sampler, rng_index=0)
            with self.lock:
                self.live[arg] = _Live(extra, sub)
            if not self.session:
                self.session, self.since, self.runs = True, {}, []
                self.decode.start()
            self.decode.submit([sub])

    def _step(self) -> None:
        now = time.monotonic()
        if now - self.read_at > READ_S and now - self.watched_at < WATCHED_S:  # the live heatmap's, now and then
            self._read_runs()
        events = self.decode.events(WAIT_S)
        ended = []
        for ev in events:
            lv = self.live.get(ev.index)
            if lv is None:
                continue
            if ev.token >= 0:
                lv.tokens.append(ev.token)
                lv.first_at = lv.first_at or time.time()
            if ev.finish:
                ended.append((ev.index, ev.token, ev.finish))
            elif ev.token >= 0:
                lv.job.deliver(Update(ev.token))
        if ended:
            self._finish(ended)

    def _finish(self, ended: list) -> None:
        """The requests that ended leave (their slots count as free at once); their last tokens go to the
        modelled-times thread with the session's runs read so far, from the oldest request still in (what the
        schedule needs), so that this thread goes on delivering the others' tokens meanwhile."""
        try:
            self._read_runs()
        except Exception as e:  # noqa: BLE001 - a fault: the requests that ended are delivered first
            failed = e
        else:
            failed = None
        done = []
        for rid, token, finish in ended:
            with self.lock:
                done.append((self.live.pop(rid), token, finish))
                self.taken -= 1
        self.finals.put((list(self.runs), done))
        self._trim_runs()
        if failed is not None:
            raise failed

    def _time_finals(self) -> None:
        """Deliver each ended request's last token with its modelled times: the flow schedule of the runs it came
        with (tokens still in flight left out: partial), worked out here, off the runner's thread (a schedule of
        a session's runs takes a large part of a second on a loaded machine: the runner would hold back every
        other request's tokens meanwhile)."""
        last, hz = len(self.llm.setup.stages()) - 1, self.llm.placement.spec.clock_hz
        while (got := self.finals.get()) is not None:
            runs, done = got
            try:
                sched = flow_schedule(runs, last, hz, partial=True)
            except Exception as e:  # noqa: BLE001 - the answers go without modelled times, and it is said
                print(f"waferrt serve: no modelled times for requests {[d[0].sub.index for d in done]}: "
                      f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
                sched = None
            for lv, token, finish in done:
                made, prompt = len(lv.tokens), len(lv.job.request.prompt_ids)
                times = request_times(sched, lv.sub.index, prompt, made) if made and sched else ModelledTimes()
                lv.job.deliver(Update(token, finish, times, lv.handed - lv.job.arrived))

    def _read_runs(self) -> None:
        self.read_at = time.monotonic()
        got = self.decode.runs_so_far(self.since)
        self.runs += got
        if time.monotonic() - self.watched_at < WATCHED_S:
            with self.lock:
                self.recent_runs += got

    def take_recent_runs(self) -> list:
        """The stage runs read since the last call (the live heatmap's), from then on read every READ_S for
        WATCHED_S."""
        with self.lock:
            self.watched_at = time.monotonic()
            runs, self.recent_runs = self.recent_runs, []
        return runs

    def _trim_runs(self) -> None:
        """Forget the runs before the first one of the oldest request still in (none of theirs: done)."""
        if not self.live:
            self.runs = []
            return
        oldest = min(self.live)
        keep = next((i for i, r in enumerate(self.runs) if any(it.request >= oldest for it in r.items)),
                    len(self.runs))
        self.runs = self.runs[keep:]

    def _end_session(self) -> None:
        self.session = False
        self.decode.stop()

    def _recover(self, error: Exception) -> None:
        if not self.session:
            raise error  # no decode was running: not a fault of one
        self.health = "recovering"
        print(f"waferrt serve: recovering the wafer from {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        try:
            repair(self.decode, error)
        except BaseException:
            self.health = "ok"
            raise
        self.since, self.runs = {}, []
        self.decode.submit([resumed(lv.sub, lv.tokens) for lv in self.live.values() if not lv.cancelled])
        self.health = "ok"
        gone = [(rid, -1, "cancelled") for rid, lv in self.live.items() if lv.cancelled]
        if gone:
            self._finish(gone)

    def _down(self, why: str) -> None:
        with self.lock:
            self.health = why
            ended, self.live, self.taken = list(self.live.values()), {}, 0
        for lv in ended:
            lv.job.deliver(Update(-1, f"error: {why}"))
        while True:  # those that came in meanwhile
            try:
                verb, arg, extra = self.inbox.get_nowait()
            except queue.Empty:
                return
            if verb == "job":
                extra.deliver(Update(-1, f"error: {why}"))
            elif verb == "inject":
                extra.put(RuntimeError(why))
