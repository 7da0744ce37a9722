"""The training engine shared by every task: optimisation, logging, checkpoints, resumption.

:mod:`.config` the settings (``TrainConfig``, ``train.*``), :mod:`.engine` the loop (``Trainer``), :mod:`.optimizer`
the optimiser, its parameter groups and learning-rate schedule, :mod:`.device` devices and precision,
:mod:`.state_file` the checkpoint, :mod:`.epoch_checkpoints` the epochs' weights and their average,
:mod:`.step_logs` and :mod:`.metric_logs` what is logged, :mod:`.distributed` DDP, :mod:`.concurrency` locks and
threads, :mod:`.cluster` SLURM jobs.
"""
