"""`specbench tune`: Optuna studies of each strategy's knobs, on one machine or many.

`specbench.tuning.study_runner.tune(TuneConfig(...))` is what the command calls; the parts: config (what is
asked), study_space (a study's search space from the methods' own), storage and study (Optuna engines,
identity, resumption), objective (a trial's measurement), holdout (the check on unseen prompts),
trials (running, counting and recording a study's trials, whichever way they are measured), outputs (what a
study leaves behind), serve_study (a study whose trials are `vllm serve` at a load). What the command
prints is report/tune_report.py's.
"""
