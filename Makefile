# largedet: one entry point. Every target installs what it needs first.
#   make demo   set up, then train + evaluate the default detector on the built-in shapes dataset,
#               and draw its predictions on 8 validation images (the picture's path is printed)
#   make test   set up, then run the test suite
#   make bench  set up, then run the benchmarks (they print measured ratios)
#   make docs   set up, then build the documentation site (docs/, Sphinx + MyST) into
#               docs/_build/html, warnings as errors; open docs/_build/html/index.html
PYTHON ?= python3
PIP := $(PYTHON) -m pip
DEMO_CONFIG ?= configs/shapes/faster_rcnn_R10w32_FPN_sgd_bs8_5min.yaml

.PHONY: setup demo test bench docs video-demo gpu-check gpu-wheels

# Succeeds where some OpenCV is installed: a pip distribution of it, or an importable cv2.
HAS_OPENCV := import importlib.metadata as m, importlib.util as u, sys; sys.exit(not (u.find_spec("cv2") or any((d.metadata["Name"] or "").lower().startswith("opencv") for d in m.distributions())))

# 1. a working torch/torchvision pair (the pinned one, only where none works);
# 2. largedet (editable) and its dependencies, with OpenCV's headless build (the extra
#    "opencv") only where no OpenCV is installed: all of its builds write the same cv2 folder;
# 3. the study's packages (study/: largedet_study, video_study), editable, for its scripts and tests;
# 4. Detectron2, only where none is installed (never beside or over another one).
setup:
	@$(PYTHON) -c "import torch, torchvision; torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)" 2>/dev/null \
		|| $(PIP) install -r requirements-torch.txt
	@if $(PYTHON) -c '$(HAS_OPENCV)'; then extras=test; else extras=test,opencv; fi; \
		echo $(PIP) install --quiet -e ".[$$extras]"; $(PIP) install --quiet -e ".[$$extras]"
	$(PIP) install --quiet --no-deps -e study
	$(PYTHON) tools/install_detectron2.py

demo: setup
	$(PYTHON) tools/train_net.py --config $(DEMO_CONFIG) --overwrite
	$(PYTHON) tools/predict.py --config $(DEMO_CONFIG) --resume --dataset shapes_val --num-images 8 --scale 2

video-demo: setup
	$(PYTHON) projects/video/train.py --overwrite

# two workers (one per core of CI's machine), each test file on one of them, one thread each;
# PYTEST_ARGS: more of pytest's options, e.g. a random order: PYTEST_ARGS="-p randomly --randomly-seed=7"
TEST_WORKERS ?= 2
PYTEST_ARGS ?=
test: setup
	OMP_NUM_THREADS=1 $(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

bench: setup
	$(PYTHON) benchmarks/optimizer_step.py

# Sphinx, MyST and the theme come with the extra "test" (setup); SPHINXOPTS: e.g. -E to reread
# every page. LARGEDET_SOURCE_URL=https://github.com/<owner>/largedet/blob/main points the
# links to repository files at the hosted repository instead of this checkout.
SPHINXOPTS ?=
docs: setup
	$(PYTHON) -m sphinx -b html -W --keep-going $(SPHINXOPTS) docs docs/_build/html

# The GPU check (benchmarks/RESULTS.md, "GPU check"): CUDA tests + GPU benchmarks, results in
# $(GPU_CHECK_OUT). No `setup` first: a GPU machine may have no package registry; the script
# installs what does not import from .whl (make gpu-wheels, where the registry is reachable).
# DRY=1: the same steps on tiny sizes on the CPU; STEPS=a,b: a subset; GPU_CHECK_ARGS: e.g.
# --budget 540 --archive $$OUT/gpu_check.tar.gz
GPU_CHECK_OUT ?= $(if $(DRY),output/gpu_check_dry,output/gpu_check)
gpu-check:
	$(PYTHON) benchmarks/gpu_check.py --output $(GPU_CHECK_OUT) $(if $(DRY),--dry-run) $(if $(STEPS),--steps $(STEPS)) $(GPU_CHECK_ARGS)

gpu-wheels:
	$(PYTHON) benchmarks/gpu_check.py --fetch-wheels .whl
