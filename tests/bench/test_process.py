"""bench.process: the one way bench tools run work in a child process (a JSON request in, a JSON result out)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from bench.process import WorkerError, busy_processes, report_progress, run_child


def echo(request: dict) -> dict:
    print("python's stdout")  # neither may reach the result
    os.write(1, b"a C library's stdout\n")
    return {"request": request, "variable": os.environ.get("BENCH_TEST_VARIABLE"), "pid": os.getpid()}


def counting(request: dict) -> dict:
    print("a line of the work's own", file=sys.stderr)
    for done in range(1, request["total"] + 1):
        report_progress(done, request["total"])
    return {"counted": request["total"]}


def broken(request: dict) -> None:
    raise ValueError(f"broken on purpose: {request['why']}")


def garbled(request: dict) -> None:
    os.write(2, b"\xff\xfe not UTF-8\n")  # as a C library may
    raise ValueError("after the garbage")


def stuck(request: dict) -> None:
    time.sleep(60)


def test_the_request_goes_in_and_the_result_comes_back_alone():
    result = run_child("tests.bench.test_process:echo", {"ids": [1, 2, 3]}, "echo", env={"BENCH_TEST_VARIABLE": "x"})
    assert result["request"] == {"ids": [1, 2, 3]} and result["variable"] == "x" and result["pid"] != os.getpid()


def test_progress_reports_reach_the_parent_as_made_and_stay_out_of_errors_and_results():
    reports = []
    result = run_child("tests.bench.test_process:counting", {"total": 3}, "count",
                       on_progress=lambda done, total: reports.append((done, total)))
    assert result == {"counted": 3} and reports == [(1, 3), (2, 3), (3, 3)]
    assert run_child("tests.bench.test_process:counting", {"total": 2}, "count") == {"counted": 2}  # nobody listens


def test_a_failure_names_the_work_and_ends_with_the_child_error():
    with pytest.raises(WorkerError) as error:
        run_child("tests.bench.test_process:broken", {"why": "a test"}, "the broken method", prog="python -m bench.x")
    assert str(error.value.code).startswith("python -m bench.x: the broken method failed (exit 1):")
    assert error.value.last_line == "ValueError: broken on purpose: a test"


def test_bytes_that_are_not_utf8_on_stderr_do_not_hide_the_error():
    with pytest.raises(WorkerError) as error:
        run_child("tests.bench.test_process:garbled", {}, "garbled")
    assert error.value.last_line == "ValueError: after the garbage" and "not UTF-8" in str(error.value.code)


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
