"""largedet: large mini-batch training of detectors and video models on Detectron2.

Detectron2 itself is not a dependency here: it is not on the package registry
under its own name. ``make setup`` (``tools/install_detectron2.py``) adds it only
where no Detectron2 is installed.

OpenCV is the extra ``opencv`` (its headless build), not a plain requirement: its
distributions (opencv-python, opencv-python-headless, the contrib builds) all write
the same ``cv2`` folder, so pulling one in beside another that is already installed
would overwrite it. ``make setup`` adds the extra only where no OpenCV is installed;
by hand, ``pip install -e ".[opencv]"`` where you have none.
"""

from setuptools import find_packages, setup

setup(
    name="largedet",
    version="0.1.0",
    description="Large mini-batch training of detectors and video models on Detectron2",
    python_requires=">=3.10",
    packages=find_packages(include=["largedet", "largedet.*"])
    + find_packages(where="projects/video", include=["largedet_video", "largedet_video.*"]),
    package_dir={"largedet_video": "projects/video/largedet_video"},
    install_requires=[
        "torch>=2.1",
        "torchvision>=0.16",
        "numpy>=1.24",
        "setuptools<81",  # Detectron2 still imports pkg_resources
        "fvcore>=0.1.5",
        "iopath>=0.1.9",
        "pycocotools>=2.0.6",
        "Pillow>=9",
        "matplotlib>=3.6",
        "tensorboard>=2.12",
        "termcolor>=1.1",
        "yacs>=0.1.8",
        "tabulate",
        "cloudpickle",
        "tqdm>4.29",
        "omegaconf>=2.1,<2.4",
        "hydra-core>=1.1",
        "packaging",
        "av>=11",
    ],
    extras_require={
        "opencv": ["opencv-python-headless>=4.8"],
        # optional features, each pulled in only by its extra
        "coco": ["faster-coco-eval>=1.6"],  # COCO evaluation without Detectron2's _C
        "slurm": ["submitit>=1.5"],  # tools/submit.py
        "wandb": ["wandb>=0.31"],  # WANDB.ENABLED
        "torchcodec": ["torchcodec>=0.17"],  # INPUT.VIDEO.DECODER torchcodec (needs FFmpeg)
        # the test suite exercises every optional feature whose package installs
        "test": ["pytest>=7", "faster-coco-eval>=1.6", "submitit>=1.5", "wandb>=0.31",
                 "torchcodec>=0.17"],  # fmt: skip
    },
)
