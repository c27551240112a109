"""A training job's life around the trainer: starting its processes, owning its output
folder, stopping on a signal, and recording how each invocation ended.

- :mod:`.processes`: the processes of a job (Detectron2's ``launch``, ``torchrun``, a Slurm
  task's environment) and their exit statuses;
- :mod:`.run_lock`: the output folder owned by one run at a time, and a fresh run that never
  writes over another's;
- :mod:`.elastic`: a torchrun job that restarts or loses a machine;
- :mod:`.preemption`: a signal ends the current step, a checkpoint is written, the job exits
  with status 75;
- :mod:`.run_summary`: ``run_summary.json`` and ``eval_results.json``, how each invocation
  ended, beside ``metrics.json``;
- :mod:`.slurm`: describing and submitting a Slurm job (``tools/submit.py``);
  :mod:`.slurm_state`: whether Slurm's signal is a cancel (``scancel``) or a stop to come
  back from;
- :mod:`.outcomes`: every exit status and what each signal does, as data (the docs' tables);
- :mod:`.loggers`: the process's loggers, enumerated once, and the handlers that write a run's
  log files (:mod:`.plain_logs`, :mod:`.full_disk`).

The engine uses this room; this room imports nothing of the engine."""
