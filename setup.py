"""largedet: large mini-batch training of detectors and video models on Detectron2.

Detectron2 itself is not a dependency here: it is not on the package registry
under its own name. ``make setup`` (``tools/install_detectron2.py``) adds it only
where ``import detectron2`` fails.
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
        "opencv-python-headless>=4.8",
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
    extras_require={"test": ["pytest>=7"]},
)
