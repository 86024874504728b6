"""How a combination `a+b[+c]` combines its members: the `combine.*` knobs and their search space.

Torch-free, so that a bad mode, budget or threshold pair is refused before any model loads.

- union: every member drafts every step and the whole merged trie is verified (SpecInfer's merged tree).
- budget: every member drafts; the merged trie is cut to `budget` nodes, the likeliest to be accepted
  first (each member's own score per node, calibrated online against what the target accepted).
- route: before drafting, each member is asked whether it pays this step (`router`), then the
  budget cut as above. `cost`: a model-free member (n-gram, suffix) always drafts (no forward to pay
  for); of the members with a network the one whose (1 + expected accepted tokens) / (its proposal's
  cost + the verify of its tree) is best drafts, where that beats (1 + what the model-free proposals
  are expected to bring) / (the verify of theirs), or always where there is no model-free member; it
  changes only for one `switch_margin` better; the verified trie is cut to the nodes that pay for their
  positions, where that makes the step 5% better. The costs are the run's measured ones where it
  times them (bench/pipeline.py), else `draft_cost` and `node_cost`, scaled by what steps of each kind
  took in the run. `entropy` (the seeds' rule): the target's entropy at the last committed position
  decides, with hysteresis: above `entropy_high` the later members draft (the uncertain state), below
  `entropy_low` the first one (the confident state), in between the state stays. A member left out
  drafts after `explore` idle steps anyway, so that its acceptance estimate stays current, or after
  more where that keeps its explorations to 1% of the run's time.
"""

from __future__ import annotations

from dataclasses import dataclass

from specbench.core.errors import SpecbenchError
from specbench.methods.search_space import (
    Choice,
    FloatRange,
    IntRange,
    Param,
    Ref,
    SearchSpace,
    When,
    check_ranges,
    knob,
)

COMBINE = "combine"  # the knobs' prefix: `--set combine.mode=budget`
MODES = ("union", "budget", "route")
ROUTERS = ("cost", "entropy")


@dataclass
class CombineOptions:
    mode: str = knob("route", f"how the members' proposals combine: {', '.join(MODES)}")
    budget: int = knob(0, "nodes verified a step in budget and route modes (0: the largest member's own tree "
                          "that step)", "nodes", low=0)
    router: str = knob("cost", f"route mode's rule: {', '.join(ROUTERS)}")
    draft_cost: float = knob(0.1, "cost router: a drafter forward's time as a share of a target forward "
                                  "(a run measures it where it times costs)", "", low=0.0)
    # on two CPU cores a verify over 8 positions costs about 1.2 one-token forwards (results/benchmarks), 0.03 a
    # position beyond the first; on a GPU, where a forward is bound by reading the weights, nearer 0
    node_cost: float = knob(0.03, "cost router: a verified position's time as a share of a target forward "
                                  "(a run measures it where it times costs)", "", low=0.0)
    switch_margin: float = knob(0.1, "cost router: another model member replaces the one it chose last only "
                                     "where it pays this share more", "", low=0.0)
    entropy_low: float = knob(1.0, "entropy router: below it (nats) the first member drafts", "nats", low=0.0)
    entropy_high: float = knob(3.0, "entropy router: above it (nats) the other members draft", "nats", low=0.0)
    explore: int = knob(8, "route mode: a member left out still drafts after n idle steps (more where its "
                           "drafts are dear: 1% of the run's time at most)", "steps", low=1)

    def __post_init__(self) -> None:
        if isinstance(self.budget, int) and self.budget < 0:
            raise SpecbenchError(f"{COMBINE}.budget must be at least 1 node (or 0: the largest member's own tree), "
                                 f"got {self.budget}")
        check_ranges(self, f"{COMBINE}.")
        for name, value, known in (("mode", self.mode, MODES), ("router", self.router, ROUTERS)):
            if value not in known:
                raise SpecbenchError(f"{COMBINE}.{name} must be one of {', '.join(known)}, got {value!r}")
        if self.entropy_low > self.entropy_high:
            raise SpecbenchError(f"{COMBINE}.entropy_low ({self.entropy_low:g}) must not exceed "
                                 f"{COMBINE}.entropy_high ({self.entropy_high:g}): the hysteresis would be inverted")

    @property
    def routes(self) -> bool:
        return self.mode == "route"

    @property
    def cuts(self) -> bool:
        return self.mode != "union"


# the budget: 0 (the largest member's own tree) or a few sizes around the members' defaults; the entropy
# thresholds around the AdaEDL-style 2.1 nats, the high one never below the low one (a Ref bound)
SPACE = SearchSpace((
    Param("mode", Choice(MODES)),
    Param("budget", Choice((0, 8, 16, 32, 64)), When("mode", ("budget", "route"))),
    Param("router", Choice(ROUTERS), When("mode", ("route",))),
    Param("draft_cost", FloatRange(0.02, 0.5, log=True), When("router", ("cost",))),
    Param("node_cost", FloatRange(0.002, 0.2, log=True), When("router", ("cost",))),
    Param("switch_margin", FloatRange(0.0, 0.5), When("router", ("cost",))),
    Param("entropy_low", FloatRange(0.2, 3.0), When("router", ("entropy",))),
    Param("entropy_high", FloatRange(Ref("entropy_low"), 6.0), When("router", ("entropy",))),
    Param("explore", IntRange(2, 32, log=True), When("mode", ("route",))),
))
