"""``python -m optbench <command>``: the ``optbench`` command where it is not on PATH (no
``pip install -e .``)."""

import sys

from optbench.cli import main

if __name__ == "__main__":
    sys.exit(main())
