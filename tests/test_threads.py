"""The thread tuner (common/threads.py) on a simulated machine: a clock that advances by what an
iteration costs at the thread count set, quiet or busy, so every choice is exact and the tests run
in milliseconds. The real machine is measured in BENCHMARKS.md ("CPU speed on a busy machine") and
by tests/test_train.py's busy run."""

from __future__ import annotations

import time

import pytest
import torch

from common import threads


class Machine:
    """Iteration costs by thread count; `load(step)` says how busy the machine is at an
    iteration."""

    def __init__(
        self, quiet: dict[int, float], busy: dict[int, float] | None = None, load=lambda step: False
    ):
        self.quiet, self.busy, self.load, self.now = quiet, busy or quiet, load, 0.0

    def clock(self) -> float:
        return self.now

    def run(self, tuner: threads.ThreadTuner, steps: range) -> list[int]:
        """Run the loop; the thread count of each iteration."""
        used = []
        for step in steps:
            with tuner.timed(step):
                n = torch.get_num_threads()
                self.now += (self.busy if self.load(step) else self.quiet)[n]
            used.append(n)
        return used


@pytest.fixture
def cores(monkeypatch):
    """A machine with this many cores, as torch's default thread count, restored afterwards."""
    before = torch.get_num_threads()

    def set_cores(n: int) -> None:
        monkeypatch.setattr(threads, "DEFAULT_THREADS", n)
        monkeypatch.setattr(threads, "PINNED", False)
        torch.set_num_threads(n)

    yield set_cores
    torch.set_num_threads(before)


def test_ladder_and_schedule():
    assert (
        threads.ladder(8) == [8, 4, 2, 1]
        and threads.ladder(6) == [6, 3, 1]
        and threads.ladder(1) == [1]
    )
    tries = [s for s in range(2000) if threads.scheduled(s)]
    assert tries == [16, 32, 64, 128, 256, 512, 1024, 1536]


def test_a_quiet_machine_keeps_every_core_and_the_same_iterations_every_run(cores):
    cores(2)
    machine = Machine({2: 1.0, 1: 1.4})
    first = machine.run(threads.ThreadTuner(clock=machine.clock), range(2000))
    assert machine.now < 1.01 * 2000 * 1.0  # what the tries cost on a quiet machine: under 1%
    assert first == machine.run(threads.ThreadTuner(clock=machine.clock), range(2000))
    # the tries of one thread, ended after their first
    one = [s for s, n in enumerate(first) if n == 1]
    assert one == [s + 1 for s in (16, 32, 64, 128, 256, 512, 1024, 1536)]
    resumed = machine.run(threads.ThreadTuner(clock=machine.clock), range(1000, 2000))
    assert resumed == first[1000:]  # a resumed run uses the thread counts of one never stopped


def test_a_busy_machine_moves_to_one_thread_at_the_first_try(cores):
    cores(2)
    machine = Machine({2: 1.0, 1: 1.4}, busy={2: 3.0, 1: 1.4}, load=lambda step: True)
    used = machine.run(threads.ThreadTuner(clock=machine.clock), range(600))
    assert used[:17] == [2] * 17 and set(used[20:]) == {1} | ({2} & set(used[20:]))
    # each later try of two threads ends after its one stalled iteration, and the next waits 100
    # times what it cost (1.6 here: 114 iterations), so 64 and 128 are left out
    assert [s for s, n in enumerate(used) if n == 2 and s > 16] == [33, 257, 513]
    assert machine.now < 1.15 * 600 * 1.4


def test_load_that_comes_and_goes(cores):
    cores(2)
    busy = lambda step: 300 <= step < 1100  # noqa: E731
    machine = Machine({2: 1.0, 1: 1.4}, busy={2: 3.0, 1: 1.4}, load=busy)
    used = machine.run(threads.ThreadTuner(clock=machine.clock), range(2000))
    assert used[299] == 2 and set(used[310:1100]) <= {1, 2} and used[310:1100].count(2) <= 2
    assert used[1100:1536] == [1] * 436 and set(used[1540:]) == {2}  # back at the first try upwards


def test_tiny_operators_run_faster_on_one_thread_even_quiet(cores):
    cores(2)
    machine = Machine({2: 1.0, 1: 0.7})
    used = machine.run(threads.ThreadTuner(clock=machine.clock), range(400))
    assert set(used[20:]) == {1} | ({2} & set(used[20:])) and used[-1] == 1


def test_many_cores_stop_where_the_busy_core_is_left_out(cores):
    cores(8)
    machine = Machine(
        {8: 1.0, 4: 1.6, 2: 2.8, 1: 5.0}, busy={8: 3.0, 4: 1.7, 2: 2.9, 1: 5.1}, load=lambda s: True
    )
    used = machine.run(threads.ThreadTuner(clock=machine.clock), range(1200))
    assert used[-1] == 4 and used[100:].count(4) > 1000


def test_a_pinned_count_and_other_devices_are_never_changed(cores, monkeypatch):
    cores(2)
    machine = Machine({2: 1.0, 1: 0.5})
    monkeypatch.setattr(threads, "PINNED", True)  # OMP_NUM_THREADS was set
    assert set(machine.run(threads.ThreadTuner(clock=machine.clock), range(200))) == {2}
    monkeypatch.setattr(threads, "PINNED", False)
    tuner = threads.ThreadTuner.for_device("meta", clock=machine.clock)
    assert set(machine.run(tuner, range(200))) == {2}


def test_a_failing_iteration_is_not_timed(cores):
    cores(2)
    tuner = threads.ThreadTuner()
    with pytest.raises(ValueError), tuner.timed(0):
        raise ValueError
    assert len(tuner.recent) == 0


def test_a_forward_pass_gives_the_same_bits_at_any_thread_count(cores):
    """Why decoding and evaluation may change their thread count freely: the matrix products split
    their outputs over the threads, not their sums (what sampling/generate.py's docstring relies
    on)."""
    from model import GPT, GPTConfig

    cores(2)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=128)).eval()
    idx = torch.randint(0, 65, (4, 64))
    with torch.no_grad():
        torch.set_num_threads(1)
        one = model(idx)[0]
        torch.set_num_threads(2)
        two = model(idx)[0]
    assert torch.equal(one, two)


def test_a_slowdown_on_one_thread_tries_no_more_threads(cores):
    """Steps that slow down at the bottom of the ladder (the busy process took more of the machine)
    call no try of more threads, whose first iteration would stall: only the scheduled tries, spaced
    by patience."""
    cores(2)
    machine = Machine({2: 3.0, 1: 1.4}, busy={2: 5.0, 1: 2.0}, load=lambda step: step >= 100)
    used = machine.run(threads.ThreadTuner(start=1, clock=machine.clock), range(400))
    assert [s for s, n in enumerate(used) if n == 2] == [17, 129]


@pytest.mark.parametrize("neighbour", [False, True])
def test_training_keeps_every_core_unless_another_process_uses_the_cpu(
    cores, monkeypatch, neighbour
):
    """training's tuner (steady_when_quiet): on a quiet machine no try ever runs, even where one
    thread would be faster, so every step is computed alike in every run; with a busy neighbour it
    tunes as before."""
    cores(2)
    monkeypatch.setattr(threads.OtherLoad, "busy", lambda self: neighbour)
    machine = Machine({2: 1.0, 1: 0.7}, busy={2: 2.5, 1: 1.1}, load=lambda s: neighbour)
    used = machine.run(threads.ThreadTuner(clock=machine.clock, steady_when_quiet=True), range(400))
    assert set(used) == ({1, 2} if neighbour else {2})
    assert used[-1] == (1 if neighbour else 2)


@pytest.mark.slow
def test_another_process_using_a_core_is_seen_without_timing():
    load = threads.OtherLoad()
    with threads.busy_neighbour():
        load.busy()  # from here: the neighbour's second alone
        start = time.perf_counter()
        while time.perf_counter() - start < 1.0:
            time.sleep(0.05)  # this process idles, so what is busy is the neighbour
        assert load.busy()


def test_decoding_takes_the_cores_other_processes_leave_free_from_the_start(cores, monkeypatch):
    """by_load (generate's tuner): a step of 0.3 ms on two threads beside a busy process stalls for
    time slices that a median of timed steps never sees, so the count follows the other processes'
    load alone: set before the first step (the prefill runs on it), looked at again every
    LOAD_LOOK_S."""
    cores(4)
    other = {"cores": 1.0}
    monkeypatch.setattr(threads.OtherLoad, "cores", lambda self: other["cores"])
    machine = Machine({4: 1.0, 2: 1.5, 1: 2.0})  # timing says four threads: it is not asked
    tuner = threads.ThreadTuner(clock=machine.clock, by_load=True)
    # 4 cores less a busy one: 3, the ladder's 2
    assert tuner.count == 2 and torch.get_num_threads() == 2
    assert set(machine.run(tuner, range(100))) == {2}
    other["cores"] = 0.05  # the neighbour stops: the next look, LOAD_LOOK_S later, takes every core
    machine.now += threads.LOAD_LOOK_S
    assert machine.run(tuner, range(100, 110))[-1] == 4
    other["cores"] = 3.2
    machine.now += threads.LOAD_LOOK_S
    assert machine.run(tuner, range(110, 120))[-1] == 1


@pytest.mark.slow
def test_a_busy_neighbour_is_seen_at_the_first_step_of_a_decoding_loop(cores, monkeypatch):
    cores(torch.get_num_threads())
    with threads.busy_neighbour():
        start = time.perf_counter()
        while time.perf_counter() - start < 1.0:
            time.sleep(0.05)
        # as if started a second ago
        monkeypatch.setattr(threads.STARTED, "last", threads.OtherLoad._read())
        time.sleep(1.0)
        tuner = threads.ThreadTuner(by_load=True)
    assert threads.DEFAULT_THREADS == 1 or tuner.count < threads.DEFAULT_THREADS
