"""``python -m loadtest ...``: see :mod:`loadtest.cli`."""

import sys

from loadtest.cli import main

if __name__ == "__main__":
    sys.exit(main())
