"""``python -m engine.sim``: see ``engine.sim.cli``."""

import sys

from engine.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
