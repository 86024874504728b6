"""`specbench recommend`: which strategy, with which settings, for this workload on this hardware.

Evidence first (runs, tuned studies), practitioners' published rules as the prior, a tree learned
from the results beside it. Library use:

    from specbench.recommender import make_workload, recommend
    rec = recommend(make_workload(gpu="rtx4090", task="code"))
    rec.strategy, rec.source, rec.config.command(), rec.as_json()
"""

from specbench.recommender.learn import LearnReport, learn
from specbench.recommender.prior import PRIOR, evaluate, prior_markdown
from specbench.recommender.recommendation import Recommendation, recommend
from specbench.recommender.workload import Workload, make_workload

__all__ = ["PRIOR", "LearnReport", "Recommendation", "Workload", "evaluate", "learn", "make_workload",
           "prior_markdown", "recommend"]
