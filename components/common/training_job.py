"""Facts of SageMaker's training-job API that the launcher, cleanup and the local backend share."""

from __future__ import annotations

# DescribeTrainingJob's TrainingJobStatus values after which a job never changes again.
TERMINAL_STATUSES = frozenset({"Completed", "Failed", "Stopped"})
# The longest FailureReason DescribeTrainingJob returns (and the failure file SageMaker reads).
MAX_FAILURE_REASON = 1024
# The longest MaxRuntimeInSeconds SageMaker accepts: 28 days (documented; botocore has min 1 only).
MAX_RUNTIME_LIMIT_S = 28 * 24 * 3600
