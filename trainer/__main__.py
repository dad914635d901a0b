"""``python -m trainer``: see trainer/README.md and ``python -m trainer --help``."""

import sys

from trainer.train import main

if __name__ == "__main__":
    sys.exit(main())
