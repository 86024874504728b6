"""`specbench tune`: Optuna studies of each strategy's knobs, on one machine or many.

`specbench.tuning.study_runner.tune(TuneConfig(...))` is what the command calls; the parts: config (what is
asked), study_space (a study's search space from the methods' own), storage and study (Optuna engines,
identity, resumption), objective (a trial's measurement), holdout (the check on unseen prompts),
outputs (what a study leaves behind), serve_study (a study whose trials are `vllm serve` at a load), summary
(what the command prints).
"""
