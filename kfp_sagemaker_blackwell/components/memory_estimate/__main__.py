"""``python -m kfp_sagemaker_blackwell.components.memory_estimate``: see components/memory_estimate/cli.py."""

import sys

from kfp_sagemaker_blackwell.components.memory_estimate.cli import main

sys.exit(main())
