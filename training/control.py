"""What the training loop acts on besides the data: a request to stop (StopRequest), the training clock
(Clock, paused during evals and checkpoints), and, under torchrun, every rank's agreement on both (Agreement).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

from runs.runtime import Runtime
from training import distributed


class StopRequest:
    """SIGINT / SIGTERM: the first asks training to stop after the current step; a second exits at once."""

    def __init__(self, verbose: bool = True):
        self.signum = 0
        self.verbose = verbose
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.signum:
            if self.verbose:
                print(
                    "\nsecond interrupt: exiting now, without a checkpoint (the last one is intact)",
                    file=sys.stderr,
                    flush=True,
                )
            os._exit(128 + signum)
        self.signum = signum
        if self.verbose:
            print(
                f"\n{signal.Signals(signum).name}: finishing this step, then writing a checkpoint "
                "(interrupt again to exit at once)",
                file=sys.stderr,
            )


class Clock:
    """Training seconds: one running clock, paused while the run evaluates and writes checkpoints."""

    def __init__(self, elapsed: float = 0.0):
        self.banked, self.started = elapsed, time.perf_counter()

    def elapsed(self) -> float:
        return self.banked + (time.perf_counter() - self.started if self.started is not None else 0.0)

    @contextlib.contextmanager
    def paused(self):
        self.banked, self.started = self.elapsed(), None
        try:
            yield
        finally:
            self.started = time.perf_counter()


class Agreement:
    """The stop signal and the training seconds, as every rank acts on them. One process reads them every
    iteration. torchrun ranks agree on them (one all-reduce, which waits for the slowest rank) only at the
    iterations where the host syncs anyway (log steps and evals: multiples of `sync_every`), and hold them in
    between: no other iteration waits. So under torchrun a signal or train.max_time takes effect within
    log.interval iterations, and a learning rate that follows max_time moves in steps of log.interval."""

    def __init__(self, rt: Runtime, stop: StopRequest, clock: Clock, sync_every: tuple[int, ...]):
        self.rt, self.stop, self.clock, self.sync_every = rt, stop, clock, sync_every
        self.values: tuple[int, float] | None = None

    def now(self, it: int) -> tuple[int, float]:
        """(signal number or 0, training seconds) at the start of iteration `it`."""
        host_syncs = any(it % n == 0 for n in self.sync_every)
        if self.values is None or not self.rt.distributed or host_syncs:
            signum, elapsed = distributed.agree([self.stop.signum, self.clock.elapsed()], self.rt)
            self.values = (int(signum), elapsed)
        return self.values
