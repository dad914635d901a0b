"""``python -m kfp_sagemaker_blackwell.trainer``: see trainer/README.md and ``python -m kfp_sagemaker_blackwell.trainer --help``."""

import sys

from kfp_sagemaker_blackwell.trainer.train import main

if __name__ == "__main__":
    sys.exit(main())
