"""The top of the gwdet repository: not a package. gwdet's code is the ``gwdet/`` folder below.

This file is here for one case. Python started in the folder that *holds* a checkout named
``gwdet`` (``git clone``'s default) finds the checkout before any installed gwdet, because the
working directory comes first on ``sys.path``. A folder without ``__init__.py`` would be imported
as an empty namespace package named ``gwdet``, with no error, and every later use would fail far
from the cause (``No module named 'gwdet.engine.trainer'``, ``cannot import name ... (unknown location)``).
With this file the checkout is a regular package, and importing it under the name ``gwdet`` stops
at once with an ImportError that names the folder and the fix.

Imported under any other name it does nothing: pytest imports it as the checkout folder's name
when it collects the tests (a folder with ``__init__.py`` is a package to pytest), and a checkout
named otherwise cannot shadow gwdet. It is not part of any build: pyproject.toml packages only
``gwdet`` and ``gwdet_lab``. It imports nothing but ``os``, so that it cannot fail for another reason.
"""
import os

if __name__ == "gwdet":
    _checkout = os.path.dirname(os.path.abspath(__file__))
    _holder = os.path.dirname(_checkout)
    _where = ("the working directory" if os.path.abspath(os.getcwd()) == _holder
              else "a folder on sys.path (PYTHONPATH?)")
    raise ImportError(
        f"'import gwdet' found the gwdet repository checkout {_checkout} instead of the gwdet package "
        f"(which is its gwdet/ subfolder), because {_where}, {_holder}, holds the checkout. Run Python "
        f"from inside the checkout (cd {_checkout}) or from a folder that does not hold it; to import "
        f"gwdet from any folder, install it: pip install -e {_checkout}",
        name=__name__,
        path=__file__,
    )
