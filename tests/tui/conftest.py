import pytest

from edge import activity


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The chat's baseline waits while other edge work runs on the machine; on a shared test machine that could be
    anyone's, so these tests see a quiet one (tests/test_activity.py checks the real look)."""
    monkeypatch.setattr(activity, "other_edge_work", lambda sample_s=0.5: [])
