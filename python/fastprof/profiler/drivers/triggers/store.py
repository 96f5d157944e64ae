"""The ranks agree through the process group's store: a rank that took a
run-wide request posts it (with the step every rank starts its capture at),
and every other rank's poller reads it and queues it. Nobody waits for
anybody: a rank that is dead or late never blocks another."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from fastprof import _dist
from fastprof.profiler.drivers.triggers.state import Board

__all__ = ["RankStore"]


class RankStore:
    def __init__(self, board: Board, run_name: str) -> None:
        self.board = board
        self.key = f"fastprof/{run_name}/trigger"
        self.store: Any = None
        self._seen = 0
        self._outbox: list[dict[str, Any]] = []  # proposals for the store (posted by the poller)

    def connect(self) -> None:
        """Under torch.distributed with more than one rank: the process group's store."""
        if self.board.world <= 1:
            return
        self.store = _dist.default_store()
        if self.store is None:
            self.board.notes.append("no process group store: each rank answers its own triggers at its next step")
            return
        with contextlib.suppress(Exception):
            self._seen = int(self.store.add(f"{self.key}/n", 0))

    def post(self, proposal: dict[str, Any]) -> None:
        """For the other ranks (sent by the poller at its next look)."""
        with self.board.lock:
            self._outbox.append(proposal)
        self.board.wake.set()

    def send(self) -> None:
        with self.board.lock:
            out, self._outbox = self._outbox, []
        store = self.store
        for prop in out:
            if store is None:
                continue
            seq = int(store.add(f"{self.key}/n", 1))
            store.set(f"{self.key}/{seq}", json.dumps(prop))

    def read(self) -> None:
        """Queue the other ranks' proposals posted since the last look."""
        store, b = self.store, self.board
        if store is None:
            return
        n = int(store.add(f"{self.key}/n", 0))
        while self._seen < n:
            key = f"{self.key}/{self._seen + 1}"
            if not store.check([key]):
                return  # posted but not yet written: next poll
            self._seen += 1
            try:
                prop = json.loads(store.get(key))
            except (ValueError, TypeError):
                continue
            if int(prop.get("from_rank", -1)) == b.rank:
                continue
            b.queue_request({**prop, "source": f"rank {prop.get('from_rank')}: {prop.get('source')}", "remote": True})
