"""Build step for gwdet: the package metadata, dependencies and extras (``lab``, ``deploy``,
``cluster``, ``test``) and the console scripts are in pyproject.toml.

The configs live at the top of the repository (``configs/``), where the tools and the README name
them. A wheel carries them as package data of :mod:`gwdet.model_zoo`: building the package copies
``configs/`` into ``gwdet/model_zoo/configs`` inside the build folder (never into the working
tree, so git holds one copy). An editable install (``pip install -e .``) copies nothing:
:mod:`gwdet.model_zoo` reads the checkout's ``configs/`` directly.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "configs"
PACKAGED_CONFIGS = ("gwdet", "model_zoo", "configs")  # where they go inside the package


class BuildPyWithConfigs(build_py):
    """setuptools' ``build_py``, then ``configs/`` copied into ``<build_lib>/gwdet/model_zoo/configs``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):  # gwdet.model_zoo finds the checkout's configs/
            return
        if not CONFIGS.is_dir():
            raise FileNotFoundError(f"{CONFIGS} is missing: a gwdet wheel must carry its configs (build from the "
                                    "repository or from an sdist, which includes configs/ through MANIFEST.in)")
        target = Path(self.build_lib, *PACKAGED_CONFIGS)
        if target.exists():  # a build folder from an earlier build: no config deleted since may survive
            shutil.rmtree(target)
        shutil.copytree(CONFIGS, target, ignore=shutil.ignore_patterns("__pycache__", "*.py[cod]"))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        target = Path(self.build_lib, *PACKAGED_CONFIGS)
        if target.is_dir():
            outputs += [str(path) for path in sorted(target.rglob("*")) if path.is_file()]
        return outputs


setup(cmdclass={"build_py": BuildPyWithConfigs})
