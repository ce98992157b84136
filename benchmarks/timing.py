"""What the benchmarks share: alternating timed rounds after a warm-up, their summaries, and worker processes that
run a reference under another interpreter (transformers 4.37.2 cannot share a process with transformers v5).

The scripts in `benchmarks/` run as files (`python benchmarks/run.py`), so they import this module as `timing`;
workers run the same script under the other interpreter, from a temporary folder so that the repository (and
`transformers_xl`) stays off their import path.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

# Where the benchmarks (and the fixture scripts) find the python of the legacy reference venv
# (`python3 -m venv legacy-venv && legacy-venv/bin/pip install torch==2.13.0 transformers==4.37.2 sacremoses`).
LEGACY_PYTHON_ENV = "TRANSFORMERS_XL_LEGACY_PYTHON"


def legacy_python(argument: str | None = None) -> str | None:
    """The legacy interpreter: `argument` (a `--legacy-python` option) if given, else $TRANSFORMERS_XL_LEGACY_PYTHON."""
    return argument or os.environ.get(LEGACY_PYTHON_ENV) or None


def seconds(function: Callable, *args, device="cpu") -> float:
    """Wall-clock seconds of one call, until `device` has run all of it (see `devices.synchronize`)."""
    from devices import synchronize

    synchronize(device)
    start = time.perf_counter()
    function(*args)
    synchronize(device)
    return time.perf_counter() - start


def alternate(runs: dict[str, Callable[[], float]], rounds: int, warmup: int = 2, repeats: int = 1, pause=0.0):
    """Measure every run in turn after `warmup` calls each, so that load on the machine hits all alike: in the given
    order and the reverse on alternate rounds (A, B, B, A, ...), so that no run always follows the same one (what a
    call leaves behind, threads still spinning, freed memory, caches it filled, moved the next call's time by 4-10%
    in one process). Each run measures itself and returns a number (seconds, or any other per-call figure); returns
    {name: [values]} in the given order, with `rounds * repeats` values each. `pause` seconds are slept before each
    measured call, so that threads the previous call left spinning do not run beside it."""
    for _ in range(warmup):
        for run in runs.values():
            run()
    values = {name: [] for name in runs}
    for round_ in range(rounds):
        for name in list(runs) if round_ % 2 == 0 else reversed(list(runs)):
            run = runs[name]
            for _ in range(repeats):
                time.sleep(pause)
                values[name].append(run())
    return values


def summary(values: list[float]) -> dict:
    """min, median and every value of one side's measurements."""
    return {"min": min(values), "median": statistics.median(values), "values": list(values)}


class Worker:
    """A process under another interpreter that answers each JSON request line with one JSON line (see `serve`).

    The worker runs `script` with `args` from a temporary folder. A request it failed on raises `WorkerError` with
    the worker's message; a worker that died raises it with the exit status.
    """

    def __init__(self, python: str, script: str, *args: str, env: dict | None = None):
        self.process = subprocess.Popen(
            [python, os.path.abspath(script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=tempfile.gettempdir(),
            env={**os.environ, **(env or {})},
        )

    def ask(self, request: dict) -> dict:
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # reported below from the missing answer
        line = self.process.stdout.readline()
        if not line:
            raise WorkerError(f"the worker exited with status {self.process.wait()} on {request}")
        answer = json.loads(line)
        if "error" in answer:
            raise WorkerError(answer["error"])
        return answer

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class WorkerError(RuntimeError):
    pass


def serve(handle: Callable[[dict], dict]):
    """The worker's loop: one JSON answer per request line on stdin until stdin closes. Anything else printed goes
    to stderr, so library output cannot corrupt the answers; an exception becomes {"error": ...}."""
    answers, sys.stdout = sys.stdout, sys.stderr
    for line in sys.stdin:
        try:
            answer = handle(json.loads(line))
        except Exception as error:  # reported to the asking process, which decides
            answer = {"error": f"{type(error).__name__}: {error}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
