"""When a run stops: the stop signals, the training clock, and both as every rank sees them.

A first Ctrl-C (or SIGTERM, a scheduler's warning, ...) asks the run to stop after its step with a
checkpoint; a second exits at once. Under torchrun the ranks agree on the signal and the seconds
where the host syncs anyway (`SyncedStop`), so every rank stops at the same iteration.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import time

from runs.runtime import Runtime

STOP_SIGNALS = tuple(  # "end now, or soon", which would otherwise kill the run without a checkpoint
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGXCPU")
    if hasattr(signal, name)  # Windows has SIGINT and SIGTERM only
)


class StopRequest:
    """A STOP_SIGNALS signal (Ctrl-C, kill, a closed terminal, a scheduler's warning or time limit):
    the first asks training to stop after the current step; a second exits at once."""

    def __init__(self, verbose: bool = True):
        self.signum = 0
        self.verbose = verbose
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.signum:
            if self.verbose:
                second = (
                    "second interrupt: exiting now, without a checkpoint (the last one is intact)"
                )
                print(f"\n{second}", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.signum = signum
        if self.verbose:
            then = (
                "finishing this step, then writing a checkpoint (interrupt again to exit at once)"
            )
            print(f"\n{signal.Signals(signum).name}: {then}", file=sys.stderr)


class Clock:
    """Training seconds: one running clock, paused while the run evaluates and writes
    checkpoints."""

    def __init__(self, elapsed: float = 0.0):
        self.banked = elapsed
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return self.banked + (
            time.perf_counter() - self.started if self.started is not None else 0.0
        )

    @contextlib.contextmanager
    def paused(self):
        self.banked = self.elapsed()
        self.started = None
        try:
            yield
        finally:
            self.started = time.perf_counter()


class SyncedStop:
    """The stop signal and the training seconds, as every rank acts on them: torchrun ranks agree on
    them (one all-reduce) only where the host syncs anyway (log steps and evals), so a signal or
    train.max_time takes effect within log.interval iterations."""

    def __init__(self, rt: Runtime, stop: StopRequest, clock: Clock, sync_every: tuple[int, ...]):
        self.rt = rt
        self.stop = stop
        self.clock = clock
        self.sync_every = sync_every
        self.values: tuple[int, float] | None = None

    def now(self, it: int) -> tuple[int, float]:
        """(signal number or 0, training seconds) at the start of iteration `it`."""
        host_syncs = any(it % n == 0 for n in self.sync_every)
        if self.values is None or not self.rt.distributed or host_syncs:
            # each the largest over the ranks: a signal any rank got, the slowest rank's clock
            signum, elapsed = self.rt.agree([self.stop.signum, self.clock.elapsed()])
            self.values = (int(signum), elapsed)
        return self.values


def resume_command(argv: list[str], rt: Runtime) -> str:
    """The command that continues a stopped run: its own, with train.resume=true."""
    args = [a for a in argv if not a.startswith(("train.resume=", "train.overwrite="))]
    args.append("train.resume=true")
    launcher = f"torchrun --nproc_per_node={rt.world_size}" if rt.distributed else "python"
    return f"{launcher} train.py {shlex.join(args)}"
