"""Who produced each character of a reply: runs of [characters, drafted 0/1], as saved and as coloured on screen."""

from __future__ import annotations

from edge.events import Event


def provenance_pieces(event: Event) -> list[tuple[str, bool]]:
    """An event's text split in two: the part from accepted drafts (it leads the step), then the target's."""
    return [(event.text[: event.drafted_chars], True), (event.text[event.drafted_chars:], False)]


def extend_runs(runs: list[list[int]], pieces: list[tuple[str, bool]]) -> None:
    """Append (text, drafted) pieces to [[characters, drafted 0/1], ...], merging neighbours of the same kind."""
    for text, drafted in pieces:
        if not text:
            continue
        if runs and runs[-1][1] == int(drafted):
            runs[-1][0] += len(text)
        else:
            runs.append([len(text), int(drafted)])
