"""`python -m bench.chaos`: the soak, as `python bench/soak.py`."""

import sys

from bench.chaos.cli import main

sys.exit(main())
