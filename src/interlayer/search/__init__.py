"""Architecture searches on Optuna: the Multi-Pass Transformer's hard-connection search (MPT Sec. 3.4),
``interlayer search mpt`` on the command line; see ``docs/search.md``.

:mod:`.policy` the strategy (pure), :mod:`.sampler` the Optuna sampler and what a study stores, :mod:`.mpt` the
settings, storage, study and workers, :mod:`.launch` the trials as cluster jobs (``--launcher submitit``),
:mod:`.report` the report and the pattern figure.
"""
from .launch import run_search_jobs
from .mpt import (
    SearchOutcome,
    SearchSettings,
    TrialRequest,
    TrialResult,
    run_search,
    run_worker,
    train_trial,
    write_report,
)
from .policy import Strategy, propose
from .report import draw_pattern
from .sampler import Definition, MPTSearchSampler

__all__ = ["Definition", "MPTSearchSampler", "SearchOutcome", "SearchSettings", "Strategy", "TrialRequest",
           "TrialResult", "draw_pattern", "propose", "run_search", "run_search_jobs", "run_worker", "train_trial",
           "write_report"]
