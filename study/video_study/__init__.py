"""The video batch study (projects/video/README.md, "Large batch: the batch study"): the grid
and the plan of each cell in :mod:`video_study.grid`, the runner in :mod:`video_study.runner`,
the figure and table in :mod:`video_study.plotting`. Not part of the library: it lives
beside its scripts in projects/video/benchmarks/."""
