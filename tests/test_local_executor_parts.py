"""The executor's pieces, each alone: no server, no moto, no processes (issue 27 item 4).

``TrainingJobExecutor`` composes ``ExecutorState``, ``Capacity``, ``PlansApi``, ``Supervisor``
and ``JobsApi``; these tests build one piece over a bare state and drive it directly. The
protocol end to end is tests/test_local_backend.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kfp_sagemaker_blackwell.local_backend.api import ApiError
from kfp_sagemaker_blackwell.local_backend.capacity import Capacity, Stopped
from kfp_sagemaker_blackwell.local_backend.jobs import Job, now, training_job_arn
from kfp_sagemaker_blackwell.local_backend.jobs_api import JobsApi, check_entry_point
from kfp_sagemaker_blackwell.local_backend.plans import PlansApi
from kfp_sagemaker_blackwell.local_backend.settings import ExecutorSettings
from kfp_sagemaker_blackwell.local_backend.state import ExecutorState

P6, P5 = "ml.p6-b200.48xlarge", "ml.p5.48xlarge"
REGION = "us-west-2"


class RecordingMirror:
    """Stands in for moto's training-job table: records what the pieces mirror."""

    def __init__(self) -> None:
        self.updates: list[str] = []

    def create(self, job: Job) -> None:
        self.updates.append(f"create {job.name}")

    def update(self, job: Job) -> None:
        self.updates.append(f"update {job.name} {job.secondary_status}")

    def delete(self, job: Job) -> None:
        self.updates.append(f"delete {job.name}")


def bare_state(tmp_path: Path, **settings: Any) -> ExecutorState:
    def no_clients(service: str, region: str) -> Any:
        raise AssertionError(f"no AWS client expected ({service} in {region})")

    return ExecutorState(ExecutorSettings(region=REGION, repo_root=tmp_path, work_dir=tmp_path,
                                          endpoint_env={}, **settings),
                         no_clients, RecordingMirror())  # type: ignore[arg-type]


def add_job(state: ExecutorState, name: str, itype: str = P6, count: int = 1) -> Job:
    req = {"ResourceConfig": {"InstanceType": itype, "InstanceCount": count}}
    job = Job(name, training_job_arn(REGION, name), REGION, req, now())
    state.jobs[(REGION, name)] = job
    return job


def test_capacity_selects_the_first_preference_within_its_quota(tmp_path):
    state = bare_state(tmp_path, quotas={P6: 2})
    capacity = Capacity(state)
    add_job(state, "running", P6, 2)
    req: dict[str, Any] = {"ResourceConfig": {"InstanceType": P6, "InstanceCount": 1,
                                              "InstancePreferences": [
                                                  {"InstanceType": P6, "InstanceCount": 1},
                                                  {"InstanceType": P5, "InstanceCount": 2}]}}
    assert capacity.select(REGION, req)
    assert (req["ResourceConfig"]["SelectedInstanceType"],
            req["ResourceConfig"]["SelectedInstanceCount"]) == (P5, 2)
    with pytest.raises(ApiError, match="ResourceLimitExceeded.*current utilization of 2"):
        capacity.select(REGION, {"ResourceConfig": {"InstanceType": P6, "InstanceCount": 1}})
    # with a pending time-out the job may wait for quota instead
    assert not capacity.select(REGION, {"ResourceConfig": {"InstanceType": P6,
                                                           "InstanceCount": 1},
                                        "StoppingCondition": {"MaxPendingTimeInSeconds": 60}})


def test_capacity_gives_run_slots_up_to_the_concurrency_and_a_stopped_job_none(tmp_path):
    state = bare_state(tmp_path, max_concurrent_jobs=1)
    capacity = Capacity(state)
    first, second = add_job(state, "first"), add_job(state, "second")
    capacity.acquire(first, None)
    second.stop_event.set()
    with pytest.raises(Stopped):
        capacity.acquire(second, None)
    capacity.release(first, None)
    assert capacity.running == 0


def test_plans_api_checks_the_plan_a_job_names(tmp_path):
    state = bare_state(tmp_path)
    plans = PlansApi(state)
    arn = plans.register_training_plan("reserved", instance_type=P6, instance_count=2)
    assert plans.describe_training_plan(REGION, {"TrainingPlanName": "reserved"})[
        "TotalInstanceCount"] == 2
    ok = {"ResourceConfig": {"TrainingPlanArn": arn, "InstanceType": P6, "InstanceCount": 2}}
    assert plans.check_job_plan(REGION, ok) is state.plans[arn]
    with pytest.raises(ApiError, match=f"reserves {P6}, not {P5}"):
        plans.check_job_plan(REGION, {"ResourceConfig": {"TrainingPlanArn": arn,
                                                         "InstanceType": P5}})
    with pytest.raises(ApiError, match="does not exist in eu-west-1"):
        plans.check_job_plan("eu-west-1", ok)


def test_jobs_api_stops_a_running_job_and_refuses_to_stop_a_finished_one(tmp_path):
    state = bare_state(tmp_path)
    jobs = JobsApi(state, Capacity(state), PlansApi(state), supervisor=None)  # type: ignore[arg-type]
    running, done = add_job(state, "running"), add_job(state, "done")
    done.status = "Completed"
    assert jobs.stop_training_job(REGION, {"TrainingJobName": "running"}) == {}
    assert running.status == "Stopping" and running.stop_event.is_set()
    assert state.mirror.updates == ["update running Stopping"]  # type: ignore[attr-defined]
    with pytest.raises(ApiError, match="in status Completed"):
        jobs.stop_training_job(REGION, {"TrainingJobName": "done"})
    with pytest.raises(ApiError, match="Requested resource not found"):
        jobs.describe_training_job(REGION, {"TrainingJobName": "nobody"})


@pytest.mark.parametrize("program", ["/usr/bin/curl", "~/bin/x", "perl"])
def test_jobs_api_refuses_an_entry_point_the_image_does_not_have(program):
    with pytest.raises(ApiError, match="is not a program of the training image"):
        check_entry_point({"AlgorithmSpecification": {"ContainerEntrypoint": [program]}})
    check_entry_point({"AlgorithmSpecification": {"ContainerEntrypoint": ["/usr/bin/bash"]}})
