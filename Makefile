# largedet: one entry point. Every target installs what it needs first.
#   make demo   set up, then train + evaluate the default detector on the built-in shapes dataset
#   make test   set up, then run the test suite
#   make bench  set up, then run the benchmarks (they print measured ratios)
PYTHON ?= python3
PIP := $(PYTHON) -m pip
DEMO_CONFIG ?= configs/shapes/faster_rcnn_R18_FPN_sgd_bs8.yaml

.PHONY: setup demo test bench video-demo

# 1. a working torch/torchvision pair (the pinned one, only where none works);
# 2. largedet (editable) and its dependencies; 3. Detectron2, only where it does not import.
setup:
	@$(PYTHON) -c "import torch, torchvision; torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)" 2>/dev/null \
		|| $(PIP) install -r requirements-torch.txt
	$(PIP) install --quiet -e ".[test]"
	$(PYTHON) tools/install_detectron2.py

demo: setup
	$(PYTHON) tools/train_net.py --config $(DEMO_CONFIG)

video-demo: setup
	$(PYTHON) projects/video/train.py

test: setup
	$(PYTHON) -m pytest -q

bench: setup
	$(PYTHON) benchmarks/optimizer_step.py
