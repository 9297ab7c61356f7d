"""The thread governor of whole passes (edge/kernels/threads.py): it keeps the fastest count, finds a machine that got
busy within a few passes and a quiet one again at the next probe; and a model decodes the same tokens under it."""

from __future__ import annotations

from edge.kernels.threads import ThreadGovernor, candidate_counts


def run(governor: ThreadGovernor, passes: int, cost: dict[int, float], rows: int = 1) -> list[int]:
    """`passes` passes where a pass on n threads takes cost[n] seconds; the counts they ran on."""
    used = []
    for _ in range(passes):
        threads = governor.next(rows)
        governor.record(threads, rows, cost[threads])
        used.append(threads)
    return used


def test_candidate_counts_halve_down_to_one():
    assert candidate_counts(1) == (1,)
    assert candidate_counts(2) == (2, 1)
    assert candidate_counts(8) == (8, 4, 2, 1)
    assert candidate_counts(6) == (6, 3, 1)


def test_a_quiet_machine_keeps_the_full_team_and_probes_rarely():
    governor = ThreadGovernor(2, probe_every=64)
    used = run(governor, 256, {2: 0.006, 1: 0.010})
    assert used.count(1) <= 1 + 256 // 64  # the first try, then one probe per 64 passes
    assert governor.current == 2
    steady = ThreadGovernor(2)  # the default intervals: each losing probe doubles the wait, up to 1024 passes
    assert run(steady, 4000, {2: 0.006, 1: 0.010}).count(1) <= 12


def test_a_busy_machine_moves_to_fewer_threads_and_back_when_quiet():
    governor = ThreadGovernor(2, probe_every=64)
    run(governor, 100, {2: 0.006, 1: 0.010})
    busy = run(governor, 10, {2: 0.018, 1: 0.011})  # another process took a core: the full team stalls
    assert busy[-5:] == [1] * 5
    quiet = run(governor, 130, {2: 0.006, 1: 0.010})
    assert quiet[-30:].count(2) >= 28 and governor.current == 2  # a probe found the machine quiet again


def test_row_counts_are_measured_apart():
    governor = ThreadGovernor(2, probe_every=1000)
    run(governor, 10, {2: 0.006, 1: 0.010}, rows=1)
    used = run(governor, 10, {2: 0.009, 1: 0.020}, rows=5)
    assert used[0] == 2 and used[1] == 1 and used[2:] == [2] * 8  # a new row count: a baseline, one try, the best


def test_one_call_drafts_run_on_the_count_the_governor_picks(llama_dir, monkeypatch):
    """A draft's tokens meet the team at every layer as a pass's rows do: one-call drafts run on the governed count,
    timed per drafted token apart from whole passes, and the output stays plain decoding's."""
    from edge import Engine
    from edge.kernels.runner import DRAFT_ROWS
    from tests.helpers import greedy

    prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox"
    expected = greedy(Engine.load(llama_dir, max_context=128), prompt, 30)
    fast = Engine.load(llama_dir, max_context=128, drafter="early-exit:1", draft_length=3)
    runner = fast.model.runner
    runner.matmul.threads = 2  # a team to govern, whatever torch's count in this test worker
    asked = []
    original = ThreadGovernor.next
    monkeypatch.setattr(ThreadGovernor, "next", lambda self, rows: asked.append(rows) or original(self, rows))
    assert greedy(fast, prompt, 30) == expected
    assert DRAFT_ROWS in asked and 1 in asked  # drafts and single-row passes both asked the governor
    assert {rows for _, rows in runner._fused._governor._estimates} >= {DRAFT_ROWS, 4}  # timed apart from passes
