"""`specbench recommend`: which strategy, with which settings, for this workload on this hardware.

Evidence first (runs, tuned studies), practitioners' published rules as the prior, a tree learned
from the results beside it. Library use:

    from specbench.recommend import make_workload, recommend
    rec = recommend(make_workload(gpu="rtx4090", task="code"))
    rec.strategy, rec.source, rec.config.command(), rec.as_json()
"""

from specbench.recommend.learn import LearnReport, learn
from specbench.recommend.prior import PRIOR, evaluate, prior_markdown
from specbench.recommend.recommendation import Recommendation, recommend
from specbench.recommend.workload import Workload, make_workload

__all__ = ["PRIOR", "LearnReport", "Recommendation", "Workload", "evaluate", "learn", "make_workload",
           "prior_markdown", "recommend"]
