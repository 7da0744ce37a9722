"""Architecture searches on Optuna. :mod:`.mpt`: the Multi-Pass Transformer's hard-connection search (MPT Sec. 3.4),
``interlayer search mpt`` on the command line; see ``docs/search.md``."""
from .mpt import (Definition, MPTSearchSampler, SearchOutcome, SearchSettings, Strategy, TrialRequest, TrialResult,
                  draw_pattern, propose, run_search, run_worker, train_trial, write_report)

__all__ = ["Definition", "MPTSearchSampler", "SearchOutcome", "SearchSettings", "Strategy", "TrialRequest",
           "TrialResult", "draw_pattern", "propose", "run_search", "run_worker", "train_trial", "write_report"]
