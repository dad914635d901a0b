"""Facts of SageMaker's training-job API that the launcher, cleanup and the local backend share."""

from __future__ import annotations

# DescribeTrainingJob's TrainingJobStatus values after which a job never changes again.
TERMINAL_STATUSES = frozenset({"Completed", "Failed", "Stopped"})
# The longest FailureReason DescribeTrainingJob returns (and the failure file SageMaker reads).
MAX_FAILURE_REASON = 1024
