"""The CPU thread count, chosen by timing the work, so that a busy machine does not stall every
operator: an OpenMP thread that shares a core with a busy process makes every operator wait
(docs/training.md, "Speed on a CPU").

A `ThreadTuner` times the iterations of one loop that repeats the same work (training steps, eval
batches, decoded tokens); now and then, and at once when they slow down, it tries the next count of
its ladder (N, N/2, ..., 1) and keeps it if it was faster by a margin. Training's tuner never leaves
the full count unless other processes use the CPU (`steady_when_quiet`: a step's bits depend on the
thread count), so quiet runs and resumed ones match bit for bit. A count the user chose
(`OMP_NUM_THREADS`, train.threads) is never changed.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator

import torch

DEFAULT_THREADS = torch.get_num_threads()  # torch's own choice at start-up: one per physical core
# the user's count
PINNED = any(os.environ.get(name) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"))

FIRST_TRY = 16  # the first scheduled try, at this iteration; then 32, 64, ... up to every SPACING
SPACING = 512
MARGIN = 0.1  # another count is kept only if its iterations were this much faster
SLOWDOWN = 1.3  # iterations this much slower than when the count was settled call a try at once
# a try of fewer threads whose first iteration took this many times the current ones ends there:
ABORT = 1.25
# on a quiet machine such a try costs a fraction of one iteration (4 x 128: 0.35 of one; 6 x 384:
# 0.76)
# the same for more threads, whose first iteration also wakes the threads that slept
ABORT_MORE = 2.0
WINDOW = 8  # the latest iterations at the current count: their median is what a try is held against
# after a lost try of more threads, wait this many times what it cost before the next one
PATIENCE = 100
# `by_load`: seconds between looks at the other processes' load (/proc/stat ticks 10 ms)
LOAD_LOOK_S = 0.5


def ladder(top: int) -> list[int]:
    """The counts a tuner moves between: top, top/2, top/4, ..., 1."""
    counts = [top]
    while counts[-1] > 1:
        counts.append(counts[-1] // 2)
    return counts


def scheduled(step: int) -> bool:
    """Whether a try falls on this iteration: 16, 32, 64, ..., 512, then every 512."""
    return step >= FIRST_TRY and (
        step % SPACING == 0 or (step < SPACING and step & (step - 1) == 0)
    )


class ThreadTuner:
    """Times one loop's iterations (`with tuner.timed(step): ...`) and picks its thread count.

    `start` is the count to begin with (a resumed run's, from its checkpoint), else the one set now.
    `tries` is how many iterations a try runs at the other count: the first one absorbs the switch
    and only decides whether to end the try at once; the median of the rest is held against the
    median of the last WINDOW iterations at the current count (a slowdown must last half a window to
    call a try, so a pause of the machine or the garbage collector does not). Disabled (a no-op) off
    the CPU, with a pinned count, or with a single core.
    """

    def __init__(
        self,
        enabled: bool = True,
        tries: int = 4,
        start: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        steady_when_quiet: bool = False,
        by_load: bool = False,
    ):
        self.counts = ladder(DEFAULT_THREADS)
        self.others = OtherLoad() if steady_when_quiet else None  # None: tune on timing alone
        readable = STARTED.last is not None  # /proc/stat: Linux; elsewhere by_load tunes on timings
        # `_count_for_load`
        self.by_load = OtherLoad(since=STARTED.last) if by_load and readable else None
        self.looked = clock()
        self.enabled = enabled and not PINNED and len(self.counts) > 1
        self.tries = max(2, tries)
        self.clock = clock
        # or where the last tuner left it: a busy machine stays busy
        start = start or torch.get_num_threads()
        self.count = min(self.counts, key=lambda c: abs(c - start))
        self.recent: deque[float] = deque(maxlen=WINDOW)  # iterations at `count`
        self.settled: float | None = None  # their median when `count` was chosen or last confirmed
        self.trial: list[float] | None = None  # iterations of the try under way, at `trying`
        self.trying = self.count
        self.upward = False  # the direction of the next scheduled try, alternating
        self.step = 0
        self.started = 0.0
        self.next_upward = 0.0  # the clock's time before which no try of more threads starts
        # set now: the prefill before the first step runs on it
        if self.by_load is not None and self.enabled:
            self.count = self.trying = self._count_for_load()
            torch.set_num_threads(self.count)

    @classmethod
    def for_device(cls, device: torch.device | str, enabled: bool = True, **kwargs) -> ThreadTuner:
        return cls(enabled=enabled and torch.device(device).type == "cpu", **kwargs)

    def timed(self, step: int | None = None) -> ThreadTuner:
        """Time the iteration in the with-block; `step` is its number (default: one more than the
        last)."""
        self.step = self.step + 1 if step is None else step
        return self

    def __enter__(self) -> ThreadTuner:
        if self.enabled:
            want = self.trying if self.trial is not None else self.count
            if torch.get_num_threads() != want:  # another loop's tuner ran in between
                torch.set_num_threads(want)
            self.started = self.clock()
        return self

    def __exit__(self, kind, *_) -> None:
        if self.enabled and kind is None:
            self._record(self.clock() - self.started)

    def _record(self, seconds: float) -> None:
        if self.by_load is not None:
            if self.clock() - self.looked >= LOAD_LOOK_S:
                self.count = self.trying = self._count_for_load()
            return
        if self.trial is not None:
            return self._try(seconds)
        self.recent.append(seconds)
        if len(self.recent) < self.recent.maxlen:
            return
        now = statistics.median(self.recent)
        if self.settled is None:
            self.settled = now
        # the full count on a quiet machine: the same steps, bit for bit, every run
        if self._steady():
            self.settled = now
        elif scheduled(self.step):
            upward, self.upward = self.upward, not self.upward
            # too soon for more threads: fewer instead
            upward = upward and not self._waiting(upward=True)
            if not self._waiting(upward):
                self._start(upward)
        # the machine got busier: fewer threads, if there are fewer
        elif now > SLOWDOWN * self.settled:
            if self.count > self.counts[-1]:
                self._start(upward=False)
            else:  # already one: more threads would only wait for the busy core
                self.settled = now

    def _count_for_load(self) -> int:
        """`by_load`'s count (decoded tokens): the most threads the cores other processes leave free
        hold, from /proc/stat, not timed: a 0.3 ms step stalls for time slices a median never sees
        (BENCHMARKS)."""
        self.looked = self.clock()
        free = max(1, round(DEFAULT_THREADS - self.by_load.cores()))
        return max(c for c in self.counts if c <= free)

    def _steady(self) -> bool:
        """Whether to stay at the full count: asked for, there, and no other process is using the
        CPU."""
        if self.others is None or self.count != self.counts[0]:
            return False
        if not (scheduled(self.step) or statistics.median(self.recent) > SLOWDOWN * self.settled):
            return False  # only read where a try could start
        return not self.others.busy()

    def _other(self, upward: bool) -> int:
        i = self.counts.index(self.count)
        options = [i - 1, i + 1] if upward else [i + 1, i - 1]  # the ladder runs from many to one
        return self.counts[next(j for j in options if 0 <= j < len(self.counts))]

    def _waiting(self, upward: bool) -> bool:
        """Whether this try would add threads too soon after one that lost: under load, the first
        iteration of more threads can stall for a time slice, many times a small iteration (a
        decoded token), so the tries of more threads are spaced by what the last one cost. Only ever
        below the top count, which only load brings, so a quiet run's choices stay the same every
        run."""
        return self._other(upward) > self.count and self.clock() < self.next_upward

    def _start(self, upward: bool) -> None:
        self.trying = self._other(upward)
        self.trial = []
        torch.set_num_threads(self.trying)

    def _try(self, seconds: float) -> None:
        self.trial.append(seconds)
        current = statistics.median(self.recent)
        limit = ABORT if self.trying < self.count else ABORT_MORE
        # the other count stalls: back at once
        if len(self.trial) == 1 and seconds > limit * current:
            return self._end(won=False, median=current)
        if len(self.trial) == self.tries:
            tried = statistics.median(self.trial[1:])
            self._end(
                won=tried < (1 - MARGIN) * current, median=tried if tried < current else current
            )

    def _end(self, won: bool, median: float) -> None:
        if self.trying > self.count and not won:
            self.next_upward = self.clock() + PATIENCE * max(0.0, self.trial[0] - median)
        if won:
            self.count = self.trying
            self.recent.clear()
        self.settled = median
        self.trial = None
        self.trying = self.count
        torch.set_num_threads(self.count)


class OtherLoad:
    """The CPU other processes used since the last look, in cores, on the cores this process may run
    on: their busy time in /proc/stat less this process's own (os.times). Linux only; elsewhere
    always busy."""

    # cores: a busy neighbour takes a whole one; a quiet machine's daemons, a few hundredths
    BUSY = 0.25

    def __init__(self, since: tuple[float, float, float] | None = None):
        self.last = since or self._read()  # `since`: another's reading, to measure from its time

    @staticmethod
    def _read() -> tuple[float, float, float] | None:
        """(seconds since boot of the cores' busy time, of their total time, of this process's CPU
        time)."""
        try:
            cores = {f"cpu{i}" for i in os.sched_getaffinity(0)}
            with open("/proc/stat", encoding="ascii") as f:
                rows = [line.split() for line in f if line.split()[0] in cores]
            tick = os.sysconf("SC_CLK_TCK")
        except (OSError, AttributeError, ValueError):
            return None
        busy = total = 0
        for row in rows:  # user nice system idle iowait irq softirq steal ...
            values = [int(v) for v in row[1:9]]
            busy += sum(values) - values[3] - values[4]
            total += sum(values)
        ours = os.times()
        return busy / tick, total / tick, ours.user + ours.system

    def busy(self) -> bool:
        return self.cores() > self.BUSY

    def cores(self) -> float:
        """The cores other processes used since the last look (all of them where /proc/stat cannot
        be read; none if no time passed)."""
        now = self._read()
        if now is None or self.last is None:
            return float(DEFAULT_THREADS)
        (busy0, total0, ours0) = self.last
        (busy1, total1, ours1) = now
        self.last = now
        elapsed = (total1 - total0) / max(1, len(os.sched_getaffinity(0)))
        return (busy1 - busy0 - (ours1 - ours0)) / elapsed if elapsed > 0 else 0.0


@contextlib.contextmanager
def busy_neighbour(on: bool = True) -> Iterator[None]:
    """The standard busy process the measurements of a busy machine use (tools.bench --busy, the
    tests): a pure-Python loop in a process of its own, as a second run or a browser's tab keeps one
    core busy."""
    if not on:
        yield
        return
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.2)  # running before the first step is timed
    try:
        yield
    finally:
        neighbour.kill()
        neighbour.wait()


# a reading at start-up: a loop's first look at the load covers the seconds since
STARTED = OtherLoad()
