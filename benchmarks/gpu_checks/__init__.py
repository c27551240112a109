"""The GPU check's parts (``benchmarks/gpu_check.py`` is its command line): one module per
kind of step output it reads (:mod:`.cuda_tests`, :mod:`.optimizer_step`,
:mod:`.train_throughput`, :mod:`.video`, :mod:`.figures`), the steps themselves
(:mod:`.steps`), the machine's packages (:mod:`.environment`) and running and recording the
steps (:mod:`.running`)."""
