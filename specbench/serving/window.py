"""A level's steady state: the requests that ran while the server held the level's full load.

A level begins on an empty server (its warm-up has drained) and ends draining. In a closed loop the N
clients' first requests arrive together, and once the last request is sent every answer leaves a client
idle; in an open loop the server fills as arrivals come and empties after the last one. The window runs
from the first answer (before it the server was only filling: every client had sent, no one had been
answered) to the first answer at or after the last request was sent (after it fewer requests are in
flight); a request is in it when it was sent and answered inside. Warm-up and cooldown are cut where the
load itself changes, so the cut needs no share or duration to be chosen.
"""

from __future__ import annotations

from specbench.core.records.serve_records import RequestRecord


def steady_state(records: list[RequestRecord]) -> list[RequestRecord]:
    """The answered requests sent and answered inside the level's steady window; none where the level never
    held its load (every request sent before the first answer: a single wave)."""
    answered = [r for r in records if r.error is None and r.e2e is not None]
    if not answered:
        return []
    ends = sorted(r.sent + r.e2e for r in answered)
    last_sent = max(r.sent for r in records)
    start, end = ends[0], next((t for t in ends if t >= last_sent), ends[-1])
    return [r for r in answered if r.sent >= start and r.sent + r.e2e <= end]
