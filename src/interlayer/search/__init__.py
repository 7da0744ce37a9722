"""Architecture searches on Optuna: the Multi-Pass Transformer's hard-connection search (MPT Sec. 3.4),
``interlayer search mpt`` on the command line; see ``docs/search.md``.

:mod:`.policy` the strategy (pure), :mod:`.sampler` the Optuna sampler and what a study stores, :mod:`.mpt` the
settings, storage, study and workers (``SearchSettings``, ``run_search``), :mod:`.launch` the trials as cluster jobs
(``--launcher submitit``), :mod:`.report` the report and the pattern figure. Each name is imported from its module.
"""
