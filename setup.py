"""Packaging for gwdet, a detectron2 plugin for group whitening and related normalizers."""
from setuptools import find_packages, setup

setup(
    name="gwdet",
    version="0.1.0",
    description="Group whitening, batch whitening and batch-group normalization for detectron2",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["gwdet", "gwdet.*"]),
    python_requires=">=3.10",
    # detectron2 itself is not on the package index under its own name: scripts/setup_env.sh
    # installs it (or keeps an official install); see README.md.
    install_requires=[
        "torch>=2.0",
        "torchvision",
        "fvcore",
        "iopath",
        "pycocotools",
        "numpy",
        "Pillow",
        "matplotlib",
        "tabulate",
        "omegaconf>=2.1,<2.4",
        "opencv-python-headless",
        "scikit-learn",
    ],
    extras_require={"test": ["pytest"]},
)
