"""Packaging for gwdet, a detectron2 plugin for group whitening and related normalizers.

``install_requires`` is what the plugin (``gwdet``) imports at run time, with detectron2's own bounds
where detectron2 declares the same package. detectron2 itself is not on the package index under its
own name: scripts/setup_env.sh installs it (or keeps yours); see README.md, "detectron2 versions".
Extras: ``lab`` (analysis, norm study and benchmark plots), ``deploy`` (ONNX export and ONNX Runtime),
``cluster`` (SLURM jobs through submitit: ``--launcher slurm``, docs/cluster.md), ``test`` (the test suite). gwdet never imports cv2, so no OpenCV package is required.
"""
from pathlib import Path

from setuptools import find_packages, setup

here = Path(__file__).resolve().parent
packages = ["gwdet", "gwdet.*"]
if (here / "gwdet_lab").is_dir():  # the lab package beside the plugin, when the checkout has it
    packages += ["gwdet_lab", "gwdet_lab.*"]

setup(
    name="gwdet",
    version="0.1.0",
    description="Group whitening, batch whitening and batch-group normalization for detectron2",
    long_description=(here / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=packages),
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.0",
        "numpy",
        "Pillow>=7.1",  # detectron2's bound; detectron2 v0.6 also needs < 10 (set-up installs it)
        "pycocotools>=2.0.2",  # detectron2's bound
    ],
    extras_require={
        "lab": ["matplotlib", "scikit-learn"],
        # Tested with torch 2.14.1 on Python 3.10-3.13 (docs/compatibility.md).
        "deploy": ["onnx>=1.23", "onnxruntime>=1.23", "onnxscript>=0.7"],
        # Tested with submitit 1.5.4 against SLURM 22.05 (scripts/local_slurm.sh).
        "cluster": ["submitit>=1.5"],
        "test": ["pytest"],
    },
)
