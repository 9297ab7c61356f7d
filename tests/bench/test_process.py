"""bench.process: the one way bench tools run work in a child process (a JSON request in, a JSON result out)."""

from __future__ import annotations

import os
import time

import pytest

from bench.process import WorkerError, busy_processes, run_child


def echo(request: dict) -> dict:
    print("python's stdout")  # neither may reach the result
    os.write(1, b"a C library's stdout\n")
    return {"request": request, "variable": os.environ.get("BENCH_TEST_VARIABLE"), "pid": os.getpid()}


def broken(request: dict) -> None:
    raise ValueError(f"broken on purpose: {request['why']}")


def stuck(request: dict) -> None:
    time.sleep(60)


def test_the_request_goes_in_and_the_result_comes_back_alone():
    result = run_child("tests.bench.test_process:echo", {"ids": [1, 2, 3]}, "echo", env={"BENCH_TEST_VARIABLE": "x"})
    assert result["request"] == {"ids": [1, 2, 3]} and result["variable"] == "x" and result["pid"] != os.getpid()


def test_a_failure_names_the_work_and_ends_with_the_child_error():
    with pytest.raises(WorkerError) as error:
        run_child("tests.bench.test_process:broken", {"why": "a test"}, "the broken method", prog="python -m bench.x")
    assert str(error.value.code).startswith("python -m bench.x: the broken method failed (exit 1):")
    assert error.value.last_line == "ValueError: broken on purpose: a test"


def test_a_child_past_its_timeout_is_stopped():
    started = time.perf_counter()
    with pytest.raises(WorkerError, match="did not finish within 2 s"):
        run_child("tests.bench.test_process:stuck", {}, "stuck", timeout_s=2)
    assert time.perf_counter() - started < 30


def test_busy_processes_run_for_the_block_and_end_with_it():
    with busy_processes(2) as children:
        time.sleep(0.2)
        assert [child.poll() for child in children] == [None, None]  # spinning
    assert all(child.poll() is not None for child in children)
