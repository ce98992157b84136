"""How many threads a decoding step runs on: one per core that other processes leave idle, re-measured as it goes.

A decoding step is too small to split well between threads: each of its hundreds of small operations ends at a
barrier where OpenMP's threads wait for each other, so when another process holds a core (a training run, a
tokenizer, a busy loop) every operation waits for a thread the OS has not scheduled, and a step took 10x as long
beside a second torch process on 2 threads. On a quiet machine, though, the step's time is reading its weights, and
two threads stream them faster than one (a 2-core Xeon: 17 GB/s against 9-11), so a fixed single thread leaves a
quiet machine's second core unused.

`IdleCores` reads how much CPU time the other processes took in the last quarter second (Linux's `/proc/stat`, all
cores' busy time less this process's own) and `on_decoding_threads` runs each decoding step on as many threads as
there are cores they left idle, at most torch's setting and at least one. Where there is no recent quarter second to
read (the first step, or the first after a pause), the threads other processes have runnable at that instant decide
until one has passed. Where `/proc/stat` cannot be read a step runs on one thread.
"""

import contextlib
import functools
import inspect
import math
import os
import time
from typing import NamedTuple

import torch


# Threads of a decoding step: "idle cores" (one per core other processes leave idle), a number, or None (torch's
# own setting).
DECODING_THREADS: int | str | None = "idle cores"
# A forward pass that feeds a cache at most this many tokens (all sequences together) is a decoding step.
DECODING_STEP_TOKENS = 16


class CpuTimes(NamedTuple):
    """One reading: when (s), the busy seconds of all cores together, this process's CPU seconds, the core count, and
    the threads of other processes that are runnable at that instant."""

    when: float
    busy: float
    own: float
    cores: int
    others_running: int


def read_cpu_times() -> CpuTimes | None:
    """The machine's busy core-seconds from `/proc/stat`'s first line (everything but idle and iowait, guests being
    counted in user time already), this process's CPU time, and its `procs_running` (the runnable threads of the
    whole machine) less this process's own; None where there is no `/proc/stat`."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.read().splitlines()
        ticks = [int(field) for field in lines[0].split()[1:9]]
        running = next(int(line.split()[1]) for line in lines if line.startswith("procs_running "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    idle = ticks[3] + ticks[4]
    busy = (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")
    others_running = max(0, running - own_running_threads())
    return CpuTimes(time.monotonic(), busy, time.process_time(), os.cpu_count() or 1, others_running)


def own_running_threads() -> int:
    """This process's runnable threads (state R in `/proc/self/task/*/stat`: the reading one, and OpenMP threads still
    spinning after the last operation), at least 1."""
    running = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 1
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat") as stat:
                running += stat.read().rpartition(")")[2].split()[0] == "R"
        except (OSError, IndexError):
            continue  # (a thread that ended meanwhile)
    return max(1, running)


def others_busy(first: CpuTimes, second: CpuTimes) -> float:
    """Cores the other processes kept busy on average between two readings."""
    return ((second.busy - first.busy) - (second.own - first.own)) / (second.when - first.when)


class IdleCores:
    """Cores that other processes left idle over the last `WINDOW` seconds, re-read at most once a window.

    A core counts as taken when the others used more than `TAKEN` of it: a busy loop beside a step on two threads
    gets about 2/3 of a core (three runnable threads on two cores), a quiet machine's daemons a few percent. A reading
    longer ago than `STALE` says little about now (a process that ran during the pause and has finished would count
    as taking a core for the next window, a whole short `generate()` on this machine's alternating benchmarks): then
    the other processes' threads runnable at this instant count instead, until a window has passed."""

    WINDOW = 0.25
    STALE = 2 * WINDOW
    TAKEN = 1 / 3

    def __init__(self, read=read_cpu_times, clock=time.monotonic):
        self.read, self.clock = read, clock
        self.last = None
        self.idle = 1

    def __call__(self) -> int:
        if self.last is not None and self.clock() - self.last.when < self.WINDOW:
            return self.idle  # (without reading /proc/stat: 0.1 ms, at every decoding step)
        now = self.read()
        if now is None:
            return 1
        age = None if self.last is None else now.when - self.last.when
        if age is None or age > self.STALE:
            self.idle, self.last = max(1, now.cores - now.others_running), now
        elif age >= self.WINDOW:
            others = others_busy(self.last, now)
            self.idle, self.last = max(1, now.cores - max(0, math.ceil(others - self.TAKEN))), now
        return self.idle


idle_cores = IdleCores()


def decoding_threads() -> int:
    """The thread count of a decoding step under `DECODING_THREADS` (not None: `on_decoding_threads` leaves torch's
    setting alone then)."""
    if DECODING_THREADS == "idle cores":
        return idle_cores()
    if isinstance(DECODING_THREADS, int) and DECODING_THREADS >= 1:
        return DECODING_THREADS
    raise ValueError(
        f"DECODING_THREADS is {DECODING_THREADS!r}; expected 'idle cores', a number of threads (1 or more) or None"
    )


@contextlib.contextmanager
def on_a_decoding_step_threads():
    """torch's thread count set to a decoding step's for the block (`decoding_threads()`, where that is fewer than
    torch's setting and `DECODING_THREADS` is not None), and restored after it."""
    previous = torch.get_num_threads()
    threads = previous if DECODING_THREADS is None else min(previous, decoding_threads())
    if threads == previous:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def on_decoding_threads(forward):
    """Decorator of a language model's `forward(input_ids, ..., cache=...)`: a decoding step (a cache, at most
    `DECODING_STEP_TOKENS` input ids, on CPU, no gradients) runs on `decoding_threads()` threads when that is fewer
    than torch's setting, and torch's setting is restored afterwards."""
    signature = inspect.signature(forward)
    read_input_ids, read_cache = (_argument_reader(signature, name) for name in ("input_ids", "cache"))

    @functools.wraps(forward)
    def wrapper(*args, **kwargs):
        if DECODING_THREADS is None or torch.compiler.is_compiling() or torch.is_grad_enabled():
            return forward(*args, **kwargs)
        input_ids = read_input_ids(args, kwargs)
        if (
            read_cache(args, kwargs) is None
            or input_ids is None
            or input_ids.numel() > DECODING_STEP_TOKENS
            or input_ids.device.type != "cpu"
        ):
            return forward(*args, **kwargs)
        with on_a_decoding_step_threads():
            return forward(*args, **kwargs)

    # (generate() reads the signature of the forward at every step: given, it is not worked out from `forward` again)
    wrapper.__signature__ = signature
    return wrapper


def _argument_reader(signature: inspect.Signature, name: str):
    """`read(args, kwargs)`: the value of argument `name` in a call, None if not given. (Binding every call to the
    signature cost more than a tiny model's decoding step spends in some of its layers.)"""
    position = list(signature.parameters).index(name)
    return lambda args, kwargs: args[position] if len(args) > position else kwargs.get(name)
