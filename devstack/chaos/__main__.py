"""`python -m devstack.chaos`: the soak, as `python bench/soak.py`."""

import sys

from devstack.chaos.cli import main

sys.exit(main())
