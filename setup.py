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

import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# The configs a wheel carries as package data, and where: largedet/model_zoo/configs, the video
# ones under its video/ (largedet.model_zoo.get_config_file finds them there)
PACKAGED_CONFIGS = {"configs": "", os.path.join("projects", "video", "configs"): "video"}


class BuildPyWithConfigs(build_py):
    """``build_py`` that also copies the checkout's configs into the built ``largedet`` package
    (``largedet/model_zoo/configs``), so that a wheel holds them. An editable install reads
    the checkout's own files and gets no copy."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = os.path.join(self.build_lib, "largedet", "model_zoo", "configs")
        for source, folder in PACKAGED_CONFIGS.items():
            shutil.copytree(
                source,
                os.path.join(target, folder),
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                dirs_exist_ok=True,
            )


setup(
    name="largedet",
    version="0.1.0",
    description="Large mini-batch training of detectors and video models on Detectron2",
    python_requires=">=3.10",
    packages=find_packages(include=["largedet", "largedet.*"])
    + find_packages(where="projects/video", include=["largedet_video", "largedet_video.*"]),
    package_dir={"largedet_video": "projects/video/largedet_video"},
    cmdclass={"build_py": BuildPyWithConfigs},
    entry_points={
        "console_scripts": [
            "largedet-train=largedet.engine.train_net:run",  # tools/train_net.py
            "largedet-video-train=largedet_video.engine.train_net:run",  # projects/video/train.py
            "largedet-coco-eval=largedet.evaluation.coco_cli:main",  # tools/coco_eval.py
            "largedet-submit=largedet.cli.submit:main",  # tools/submit.py
            "largedet-recipe=largedet.cli.recipe:main",  # tools/recipe.py
        ]
    },
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
        # the test suite exercises every optional feature whose package installs, and builds
        # the documentation site (make docs: Sphinx, MyST, the furo theme); pytest-randomly
        # runs it in a random order on request (the default order is fixed: pytest.ini)
        "test": ["pytest>=7", "pytest-xdist>=3.5", "pytest-randomly>=3.15", "faster-coco-eval>=1.6", "submitit>=1.5", "wandb>=0.31",
                 "torchcodec>=0.17", "sphinx>=7.2,<10", "myst-parser>=3,<6", "furo>=2024.1"],  # fmt: skip
    },
)
