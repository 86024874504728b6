"""Ship a known model's drafters: those `specbench prepare <model> --rebuild` built in the user's cache from
the corpus specbench ships for the model, copied into specbench/assets/<model>/drafters/ with their build
record and the drafting knobs chosen for them (by `specbench tune` on the model), which
`specbench prepare <model>` then installs in minutes instead of training for hours.

    specbench prepare smollm2-135m --rebuild --only eagle --steps 600
    python scripts/ship_drafters.py smollm2-135m --only eagle --set eagle.depth=4 --set eagle.top_k=1

`--set` for a drafter not given with `--only` records the knobs on the drafter specbench ships already (chosen
by `specbench tune` after it shipped); its weights stay:

    python scripts/ship_drafters.py smollm2-135m --set mtp.branching=2

`--corpus` also ships the corpus chunks the build made that specbench does not ship yet (a grown corpus,
new passage tasks), so that a rebuild elsewhere reads them instead of making them again.
"""

from __future__ import annotations

import argparse
import json

from specbench.decoding.model_source import DRAFTERS, preparable
from specbench.methods.knobs import make_options, parse_sets
from specbench.training.build_drafters import record_drafting, ship, ship_corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--only", action="append", choices=DRAFTERS, default=[])
    parser.add_argument("--corpus", action="store_true", help="ship the corpus chunks made here too")
    parser.add_argument("--set", dest="sets", action="append", default=[],
                        help="STRATEGY.KNOB=VALUE: a drafting knob recorded with the shipped drafter")
    args = parser.parse_args()
    known = preparable(args.model)
    given = parse_sets(args.sets)
    # typed as the knob is, and one that does not exist refused
    drafting = {s: {k: getattr(make_options(s, values), k) for k in values} for s, values in given.items()}
    if args.corpus:
        for path in ship_corpus(known):
            print("corpus ->", path)
    for strategy in args.only:
        knobs = drafting.get(strategy, {})
        print(strategy, "->", ship(known, strategy, knobs), json.dumps(knobs))
    for strategy in sorted(set(drafting) - set(args.only)):
        knobs = drafting[strategy]
        print(strategy, "drafting ->", record_drafting(known, strategy, knobs), json.dumps(knobs))


if __name__ == "__main__":
    main()
