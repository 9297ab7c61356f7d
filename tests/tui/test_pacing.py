"""The app's update pacing: the UI thread's CPU share while a reply streams stays within its duty (edge/tui/pacing.py).

A fake clock and given CPU times: what is checked is the rule, not this machine's speed."""

from __future__ import annotations

from edge.tui.pacing import MAX_INTERVAL_S, MIN_INTERVAL_S, SHARED_CORES_DUTY, SPARE_CORE_DUTY, UpdatePacer, ui_duty


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_duty_is_small_only_when_decoding_uses_every_core():
    assert ui_duty(kernel_threads=2, cores=2) == SHARED_CORES_DUTY
    assert ui_duty(kernel_threads=4, cores=8) == SPARE_CORE_DUTY


def test_updates_wait_until_the_allowance_covers_what_one_costs():
    clock = Clock()
    pacer = UpdatePacer(0.02, clock=clock)
    pacer.update_cost_s = 0.02
    pacer.start(ui_cpu_s=5.0)
    clock.now += 0.5
    assert not pacer.due()  # 0.5 s x 2% = 10 ms of allowance, an update costs 20 ms
    clock.now += 0.5
    assert pacer.due()
    pacer.sent()
    clock.now += 0.5
    assert not pacer.due()  # never while the previous update is still being drawn
    pacer.drawn(ui_cpu_s=5.06)  # it cost 60 ms: the estimate rises, and the 60 ms count against the allowance
    assert abs(pacer.update_cost_s - 0.04) < 1e-9
    clock.now += 1.0  # 2.5 s x 2% = 50 ms allowed, 60 ms spent
    assert not pacer.due()
    clock.now += 0.49  # 2.99 s: 59.8 ms allowed
    assert not pacer.due()
    clock.now += MAX_INTERVAL_S  # however costly, an update at least every MAX_INTERVAL_S
    assert pacer.due()


def test_cheap_updates_come_often_but_not_more_than_the_minimum_interval():
    clock = Clock()
    pacer = UpdatePacer(0.5, clock=clock)
    pacer.update_cost_s = 0.001
    pacer.start(ui_cpu_s=0.0)
    clock.now += MIN_INTERVAL_S / 2
    assert not pacer.due()
    clock.now += MIN_INTERVAL_S * 0.51
    assert pacer.due()
    pacer.sent()
    pacer.drawn(ui_cpu_s=0.001)
    assert not pacer.due()
    clock.now += MIN_INTERVAL_S * 1.01
    assert pacer.due()


def test_the_cost_estimate_carries_over_to_the_next_reply():
    clock = Clock()
    pacer = UpdatePacer(0.02, clock=clock)
    pacer.start(ui_cpu_s=0.0)
    clock.now += 5.0
    pacer.sent()
    pacer.drawn(ui_cpu_s=0.03)
    estimate = pacer.update_cost_s
    pacer.start(ui_cpu_s=0.03)
    assert pacer.update_cost_s == estimate
    clock.now += estimate / 0.02 * 0.9
    assert not pacer.due()
    clock.now += estimate / 0.02 * 0.2
    assert pacer.due()
