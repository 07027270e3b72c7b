"""The soak: an hour of chaos with nothing lost (issue 43). See `devstack/chaos/cli.py`.

    python bench/soak.py --minutes 60 --seed 7
    python bench/soak.py --minutes 3 --seed 43 --plant duplicate   # the negative control: must fail
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devstack.chaos.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
