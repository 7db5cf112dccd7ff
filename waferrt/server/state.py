"""What the live page draws: the mesh's heatmaps, the requests in flight, the recent ones' times, the faults.

Contract: :func:`wafer_state(served) -> dict` (``GET /v1/wafer/state``, and every event of
``GET /v1/wafer/events``): ``health``; ``mesh`` -- ``width``, ``height`` (cores), ``tile`` ([w, h] cores),
``sram`` (per core, rows of the share of its SRAM booked: waferrt.cli.heatmap.sram_share), ``links`` (per
core, modelled link bytes of the tokens that ran since the last look: heatmap.link_bytes), ``busy`` (per tile
``"x,y"``: its share of the busiest tile's modelled cycles in those runs), ``dead`` cores as [x, y];
``requests`` (in flight: id, prompt_tokens, tokens so far and the text of the last TAIL, age_s, waiting or
running);
``recent`` (the last finished: finish, usage, wall and modelled ttft/tpot/e2e); ``counts`` (running,
waiting); ``faults`` (the fault log: kind, where, outcome, and when it was injected, fired, detected and
recovered, Unix seconds). The SRAM map is worked out once per placement (a recovery may move regions).
"""

from __future__ import annotations

import time

import numpy as np

TAIL = 48  # the last tokens of a request in flight shown as text


def _rows(img: np.ndarray) -> list:
    return np.round(np.nan_to_num(img), 4).tolist()


class StateView:
    def __init__(self, served):
        self.served, self._sram = served, (None, None)

    def __call__(self) -> dict:
        from waferrt.cli.heatmap import link_bytes, sram_share

        runner = self.served.runner
        p = runner.llm.placement
        if self._sram[0] is not p:
            self._sram = (p, _rows(sram_share(p)))
        runs = runner.take_recent_runs()
        running, waiting = runner.counts
        return {"health": runner.health, "at": time.time(), "model": self.served.limits.model,
                "mesh": {"width": p.mesh.width, "height": p.mesh.height, "tile": [p.mesh.tile_w, p.mesh.tile_h],
                         "sram": self._sram[1], "links": _rows(link_bytes(p, runs)) if runs else None,
                         "busy": _busy(runner.llm.setup, runs),
                         "dead": sorted([c.x, c.y] for c in p.mesh.dead)},
                "requests": _requests(runner, self.served.tok), "recent": list(self.served.metrics.recent),
                "counts": {"running": running, "waiting": waiting}, "faults": _faults(runner.fault_log())}


def _busy(setup, runs: list) -> dict:
    tiles = setup.stage_tiles()
    cycles: dict = {}
    for r in runs:
        t = tiles[r.stage]
        cycles[t] = cycles.get(t, 0.0) + r.cycles
    top = max(cycles.values(), default=0.0) or 1.0
    return {f"{t.tx},{t.ty}": c / top for t, c in cycles.items()}


def _requests(runner, tok) -> list:
    now = time.time()
    with runner.lock:
        live = [(rid, lv, list(lv.tokens)) for rid, lv in runner.live.items()]
    return [{"id": rid, "prompt_tokens": len(lv.job.request.prompt_ids), "tokens": len(toks),
             "text": tok.decode(toks[-TAIL:], skip_special=True), "max_tokens": lv.job.request.max_new_tokens,
             "age_s": now - lv.arrived, "state": "running" if toks else "waiting"} for rid, lv, toks in live]


def _faults(events: list) -> list:
    return [e.as_dict() | {"injected_at": e.armed_at, "fired_at": e.fired_at, "detected_at": e.detected_at,
                           "recovered_at": e.recovered_at} for e in events]
