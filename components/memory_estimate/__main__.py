"""``python -m components.memory_estimate``: see components/memory_estimate/cli.py."""

import sys

from components.memory_estimate.cli import main

sys.exit(main())
