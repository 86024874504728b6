"""Every figure of a `StrategySummary` a person reads, declared once: the summary fields it covers, its unit,
its meaning (Markdown, links relative to the repository root) and the table columns that show it, each with
its header, legend line and format.

README.md's field table and docs/summary.schema.json are rendered from `METRICS` by
scripts/render_readme_fields.py (tests/test_readme_fields.py fails until it is run); the comparison tables
(report/comparison.py) take their headers, legends and formats from it. `SUMMARY_MEANINGS` and `COLUMN_SPECS`
are two views of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Column:
    """A figure as a table column shows it: its header, its legend line (with its unit) and how it is written."""

    header: str
    legend: str
    form: str = "number"  # "x": a ratio (1.23x); "percent"; "count"; "number": 2 decimals, 1 from 10 on


@dataclass(frozen=True)
class Metric:
    """A figure: the summary fields it covers (the first names it), its unit, what it means (None: a column
    only, not in README's table) and the columns a table shows it in, by name (a summary field, or a column
    the table derives from one: `share_draft` from `time_shares`, `memory_gb` from `memory_bytes`)."""

    fields: tuple[str, ...]
    unit: str
    meaning: str | None = None
    columns: dict[str, Column] = field(default_factory=dict)


METRICS = (
    Metric(("speedup", "speedup_ci"), "ratio",
           "per prompt, turn and repeat: the strategy's tokens/s over `ar`'s on the same prompt; geometric mean over "
           "repeats, then over prompts; 95% percentile bootstrap interval over prompts. Per token, so an earlier EOS "
           "(sampling, a mismatch) is not a speedup",
           {"speedup": Column("speedup [95% CI]", "paired speedup over ar: tokens/s over ar's on the same prompt, "
                              "geometric mean over prompts, 95% bootstrap interval", "x")}),
    Metric(("tokens_per_s",), "tokens/s", "generated tokens per second of wall time, prefill included",
           {"tokens_per_s": Column("tok/s", "generated tokens per second, prefill included")}),
    Metric(("tau",), "tokens per forward", "tokens committed per target forward, the bonus token included (`ar`: 1)",
           {"tau": Column("tau", "tokens per target forward, the bonus token included")}),
    Metric(("acceptance_rate_by_position",), "share per position",
           "drafts whose position k was accepted / drafts: unconditional, the per-position rate vLLM, AIPerf and "
           "`vllm bench serve` report, and the table's acceptance row"),
    Metric(("conditional_acceptance_by_position",), "probability per position",
           "a_k = P(draft k accepted | draft k-1 accepted), over all steps (a step that drafted nothing is rejected "
           "at position 1): what the cost model multiplies"),
    Metric(("draft_efficiency",), "share",
           "accepted draft tokens / drafted tokens, every tree node counted: what a wide tree wastes",
           {"draft_efficiency": Column("eff", "accepted draft tokens / drafted tokens (every tree node)",
                                       "percent")}),
    Metric(("mismatches",), "prompts",
           "prompts whose greedy output differs from `ar`'s (must be 0); `null` (shown n/a) when sampling, where no "
           "greedy check runs; `first_divergence` and `divergence_margin` say where and how close the target's call "
           "was",
           {"mismatches": Column("mismatch", "prompts whose greedy output differs from ar's (must be 0); n/a when "
                                 "sampling: the greedy check does not run", "count")}),
    Metric(("time_shares",), "share",
           "prefill, draft, verify, other (acceptance, cache compaction, bookkeeping), summing to 1",
           {"share_prefill": Column("prefill", "share of the measured time in prefill", "percent"),
            "share_draft": Column("draft", "... in drafting", "percent"),
            "share_verify": Column("verify", "... in the target's verify forwards", "percent"),
            "share_other": Column("other", "... in acceptance, cache compaction and bookkeeping (the four sum to "
                                  "100%)", "percent")}),
    Metric(("memory_bytes",), "bytes",
           "what the strategy needs: target and drafter weights, the target's KV cache at the run's lengths, the "
           "drafter's own state; `peak_mem_bytes` is the process's peak (on a CPU one high-water mark for the whole "
           "run)",
           {"memory_gb": Column("needs GB", "memory the strategy needs: target and drafter weights, KV cache at the "
                                "run's lengths, drafter state (GB)")}),
    Metric(("cost_model",), "ratio",
           "the speedup predicted from the run's tau and draft shape and from forwards timed separately, and "
           "`measured_over_predicted` ([cost model](docs/cost-model.md))",
           {"predicted_speedup": Column("predicted", "cost model's prediction from tau, the draft shape and "
                                        "separately timed forwards", "x"),
            "measured_over_predicted": Column("meas/pred", "measured / predicted speedup: below 1 by the engine's "
                                              "overheads", "x")}),
    Metric(("engine", "transfer", "engine_agreement"), "name; ratio; prompts",
           "which engine decoded it (`specbench`, `vllm`, `transformers`: [engines](docs/engines.md)); with several "
           "engines, each engine's speedup over the first's for the same strategy, and the prompts whose greedy `ar` "
           "output agrees with the first engine's, and where the others part",
           {"transfer": Column("transfer", "the engine's speedup over specbench's for the same strategy (@vllm: "
                               "measured in vLLM, against vLLM's own ar)", "x")}),
    Metric(("outliers",), "prompts; seconds",
           "the prompts measured again: those whose seconds per token lay above median + k * MAD (scaled, 1.4826) of "
           "the strategy's prompts (`--outlier-k`, default 5), or during which the engine logged a compilation or a "
           "fallback; each with both timings (`first_wall_s`, `wall_s`) and its `cause`. Every figure uses the "
           "second timing; the table marks the strategy's speedup `!` ([runs](docs/runs.md#outliers))"),
    Metric(("prompts",), "prompts", columns={"prompts": Column("prompts", "prompts (and turns) measured", "count")}),
    Metric(("new_tokens",), "tokens", columns={"new_tokens": Column("tokens", "tokens generated", "count")}),
    Metric(("batch_size",), "sequences",
           columns={"batch_size": Column("B", "sequences decoded together; the speedup is over batched ar at the "
                                         "same batch size", "count")}),
    Metric(("peak_mem_bytes",), "bytes",
           columns={"peak_mem_gb": Column("peak GB", "the process's peak memory (GB; on a CPU one figure for the "
                                          "whole run)")}),
    Metric(("projection",), "ratio; tokens/s",
           columns={"projected_speedup": Column("projected", "speedup projected onto the --gpu profile (roofline "
                                                "model), not measured", "x"),
                    "projected_tokens_per_s": Column("proj tok/s", "tokens/s projected onto the --gpu profile, not "
                                                     "measured"),
                    "projected_fits": Column("fits", "whether weights and KV cache fit the --gpu profile's memory "
                                             "(projected)")}),
    Metric(("nvml",), "%; GB/s; J",
           columns={"mem_util_pct": Column("mem util %", "NVML memory-controller busy time (%)"),
                    "dram_bw_gbs": Column("DRAM GB/s", "DRAM bandwidth through NVML GPM (GB/s)"),
                    "energy_j": Column("energy J", "GPU energy over the strategy's generations (J)")}),
)
"""The figures in the order README.md's table lists those with a meaning."""

SUMMARY_MEANINGS = {m.fields: m.meaning for m in METRICS if m.meaning}
"""The summary fields a meaning covers -> the meaning: README.md's field table, row by row."""

COLUMN_SPECS = {name: column for m in METRICS for name, column in m.columns.items()}
"""Each column a comparison table can show -> how it shows its figure."""
