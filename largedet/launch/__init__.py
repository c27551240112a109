"""Submitting a training job to a cluster: Slurm through submitit (:mod:`largedet.launch.slurm`,
used by ``tools/submit.py``). The processes of a job start through
:mod:`largedet.engine.launch`; this room only describes and submits the job, and imports
nothing of the engine."""
