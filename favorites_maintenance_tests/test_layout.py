"""The package's modules stay short enough to be read whole: a module that outgrows the limit is
split along what it does (README.md, "Layout")."""

from __future__ import annotations

import pathlib

import favorites_maintenance

PACKAGE = pathlib.Path(favorites_maintenance.__file__).parent
MAX_MODULE_LINES = 600


def test_no_module_of_the_package_is_over_600_lines():
    too_long = {str(path.relative_to(PACKAGE)): lines
                for path in sorted(PACKAGE.rglob("*.py"))
                if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert too_long == {}
