"""Strategies: a drafter plus a controller, named on the command line (`eagle+dflash`, `ngram`, ...).

- registry.py: every method by name; each method is one module (its knobs, search space, network
  and drafter) that declares a `Method` (base.py).
- names.py: parsing `--strategy` values into `StrategyName`s; knobs.py: `--set` and TOML knob values.
- build.py: strategy names -> drafters and controllers; combine.py: combinations `a+b`, and
  combine_options.py: how they combine (`combine.*`: union, a node budget, routing).
- controllers.py and dspark_scheduler.py: how much to draft each step.
- published/: drafters in the formats their authors ship (EAGLE-3, DFlash, DeepSpec, MTP inside a
  target), read into the same drafters; `specbench convert`.
"""
