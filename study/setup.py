"""The large-batch study: its grids, runners and reports as two packages beside largedet.

``make setup`` installs it editable (``pip install --no-deps -e study``), so the study's
scripts, its tests and the report import ``largedet_study`` and ``video_study`` as installed
packages. It is not part of the largedet wheel.
"""

from setuptools import setup

setup(
    name="largedet-study",
    version="0.1.0",
    description="largedet's large-batch study: grids, runners and the generated reports",
    packages=["largedet_study", "video_study"],
    python_requires=">=3.10",
    # largedet (the repository's root project) and matplotlib come with `make setup`
    install_requires=[],
)
