"""`python3 -m hicache.oracle.checktrace.examples DIR`: write (or `--check`) the trace examples."""

from __future__ import annotations

import sys

from hicache.oracle.checktrace.examples import main

sys.exit(main())
