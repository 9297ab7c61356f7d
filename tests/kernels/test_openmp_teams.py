"""A thread that ends a load or a reply releases its OpenMP team (edge/kernels/openmp_teams.py): with teams of
threads that had finished their work still alive, a model run on another thread decoded at 55-65% of its speed."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from edge import Engine
from edge.engine import engine as engine_module
from edge.kernels import openmp_teams


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(openmp_teams._pause_resource_all() is None, reason="no OpenMP runtime with omp_pause_resource_all")
def test_the_release_ends_the_calling_threads_team():
    counts = {}

    def work() -> None:
        torch.set_num_threads(2)  # this thread's own setting (conftest keeps the main thread on 1)
        torch.ones(2048, 2048) @ torch.ones(2048, 2048)  # an OpenMP parallel region: the thread's team starts
        counts["with a team"] = os_threads()
        openmp_teams.release_thread_team()
        counts["released"] = os_threads()

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert counts["released"] < counts["with a team"], counts


def test_a_load_and_every_reply_release_the_team_on_their_thread(llama_dir, monkeypatch):
    released = []
    monkeypatch.setattr(engine_module, "release_thread_team", lambda: released.append(threading.get_ident()))
    engine = Engine.load(llama_dir, max_context=64)
    assert released == [threading.get_ident()]
    replies = []
    worker = threading.Thread(target=lambda: replies.append(list(engine.generate("hi", max_new_tokens=3))))
    worker.start()
    worker.join()
    assert len(replies) == 1 and len(released) == 2 and released[1] != released[0]  # on the reply's own thread
