"""`python -m hicache ...`: the same command line as the `hicache` console script."""

from __future__ import annotations

import sys

from hicache.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
