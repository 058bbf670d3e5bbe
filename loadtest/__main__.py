"""``python -m loadtest ...``: see :mod:`loadtest.cli`."""

import sys

from loadtest.cli import main, stop_cleanly_on_sigterm

if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    sys.exit(main())
