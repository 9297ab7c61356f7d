"""Stop strings over streamed text: hold back what could still become a stop string, cut at the first match."""

from __future__ import annotations


class StopStrings:
    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self.stops = tuple(stop for stop in stops if stop)
        self._pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Add new text; return (text safe to emit, whether a stop string was reached)."""
        if not self.stops:
            return text, False
        self._pending += text
        cut = min((i for i in (self._pending.find(stop) for stop in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            emit, self._pending = self._pending[:cut], ""
            return emit, True
        keep = self._partial_match_length()
        emit = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep :]
        return emit, False

    def flush(self) -> str:
        """Text held back because it was a prefix of a stop string, released when generation ends otherwise."""
        rest, self._pending = self._pending, ""
        return rest

    def _partial_match_length(self) -> int:
        """Length of the longest suffix of the pending text that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:size]):
                    best = size
                    break
        return best
