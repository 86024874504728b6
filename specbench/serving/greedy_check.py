"""The lossless check under load: each strategy's greedy answers against the `ar` server's, request by request.

Both servers answered the same prompts at the same level; greedy speculation must reproduce plain
decoding token for token. Batched kernels may round differently from one batch shape to another, so a
mismatch is reported with where it starts, never hidden. Servers that stream no token ids are compared
by text (the first divergence is then a character offset).
"""

from __future__ import annotations

from specbench.analysis.lossless import first_divergence
from specbench.core.records.serve_records import Agreement, RequestRecord
from specbench.serving.level_stats import paired


def greedy_agreement(records: list[RequestRecord], baseline: list[RequestRecord]) -> Agreement:
    """Compared requests, mismatches and each mismatch's first divergence (request index -> position)."""
    pairs = paired(records, baseline)
    by_ids = all(r.token_ids is not None and b.token_ids is not None for r, b in pairs)
    divergences = {}
    for r, b in pairs:
        at = first_divergence(r.token_ids, b.token_ids) if by_ids else first_divergence(list(r.text), list(b.text))
        if at is not None:
            divergences[r.index] = at
    return Agreement(len(pairs), len(divergences), "token" if by_ids else "character", divergences)
