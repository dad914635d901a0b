"""LogTail (common/cloudwatch.py) and parse_logs' CloudWatch source, against the
local backend (moto's CloudWatch Logs on 127.0.0.1)."""

import itertools
import time

import pytest
from botocore.exceptions import ClientError

from kfp_sagemaker_blackwell.catalog import logformat as lf
from kfp_sagemaker_blackwell.common.cloudwatch import (
    TRAINING_JOBS_LOG_GROUP,
    LogTail,
    training_job_tail,
)
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.components.parse_logs.launcher import parse_training_job
from kfp_sagemaker_blackwell.local_backend import LocalBackend

_names = itertools.count()


@pytest.fixture(scope="module")
def backend():
    with LocalBackend() as b:
        yield b


@pytest.fixture
def logs(backend):
    return backend.client("logs")


def _group(logs, name=None):
    group = name or f"/test/cloudwatch/{next(_names)}"
    logs.create_log_group(logGroupName=group)
    return group


def _put(logs, group, stream, messages, *, create=True, start_ms=None):
    if create:
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
    now = start_ms if start_ms is not None else int(time.time() * 1000)
    for i in range(0, len(messages), 10_000):  # PutLogEvents takes at most 10,000 events
        logs.put_log_events(logGroupName=group, logStreamName=stream, logEvents=[
            {"timestamp": now + i + j, "message": m}
            for j, m in enumerate(messages[i:i + 10_000])])


def test_reads_every_stream_under_the_prefix_and_pages_to_the_end(logs):
    group = _group(logs)
    _put(logs, group, "job/algo-1-1700000000", [f"a{i}" for i in range(25)])
    _put(logs, group, "job/algo-2-1700000000", [f"b{i}" for i in range(5)])
    _put(logs, group, "job-other/algo-1-1700000000", ["not mine"])
    tail = LogTail(logs, group, "job/", page_limit=10)
    events = tail.poll()
    assert [e.message for e in events] == [f"a{i}" for i in range(25)] + [f"b{i}" for i in range(5)]
    assert {e.stream for e in events} == {"job/algo-1-1700000000", "job/algo-2-1700000000"}
    # describe + algo-1: 3 full pages + 1 short + the end; algo-2: 1 page + the end
    assert tail.requests == 1 + 4 + 2


def test_more_than_ten_thousand_events_take_few_full_page_requests(logs):
    group = _group(logs)
    _put(logs, group, "big/algo-1-1700000000", [f"line {i}" for i in range(12_500)])
    tail = LogTail(logs, group, "big/")
    events = tail.poll()
    assert len(events) == 12_500 and events[-1].message == "line 12499"
    assert len({e.message for e in events}) == 12_500
    assert tail.requests == 1 + 3  # describe, 10,000, 2,500, the end (token unchanged)


def test_a_second_poll_returns_only_new_events_and_new_streams(logs):
    group = _group(logs)
    _put(logs, group, "job/algo-1-1700000000", ["one", "two"])
    tail = training_job_tail(logs, "job")
    tail.group = group
    assert [e.message for e in tail.poll()] == ["one", "two"]
    assert tail.poll() == []
    _put(logs, group, "job/algo-1-1700000000", ["three"], create=False)
    _put(logs, group, "job/algo-1-1700009999", ["after restart"])  # a spot restart
    assert [e.message for e in tail.poll()] == ["three", "after restart"]
    assert tail.poll() == []


def test_a_group_that_does_not_exist_yet_has_no_streams(logs):
    tail = LogTail(logs, "/test/never-created", "job/")
    assert tail.streams() == [] and tail.poll() == []


class ThrottlingLogs:
    """A CloudWatch Logs client that throttles chosen calls, as AWS does past its rate."""

    def __init__(self, real, throttle_calls):
        self.real = real
        self.throttle_calls = set(throttle_calls)  # 1-based numbers of get_log_events calls
        self.calls = 0

    def describe_log_streams(self, **kwargs):
        return self.real.describe_log_streams(**kwargs)

    def get_log_events(self, **kwargs):
        self.calls += 1
        if self.calls in self.throttle_calls:
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}},
                              "GetLogEvents")
        return self.real.get_log_events(**kwargs)


def test_throttling_backs_off_and_loses_no_page(logs):
    group = _group(logs)
    _put(logs, group, "job/algo-1-1700000000", [f"a{i}" for i in range(30)])
    _put(logs, group, "job/algo-2-1700000000", [f"b{i}" for i in range(30)])
    sleeps = []
    # throttled: the 2nd page of algo-1 (twice in a row) and the first page of algo-2
    client = ThrottlingLogs(logs, throttle_calls={2, 3, 7})
    tail = LogTail(client, group, "job/", page_limit=10, sleep=sleeps.append)
    events = tail.poll()
    assert [e.message for e in events] == [f"a{i}" for i in range(30)] + [f"b{i}" for i in range(30)]
    assert sleeps == [1.0, 2.0, 1.0] and tail.throttled == 3


def test_throttling_that_does_not_stop_is_raised_after_the_back_off(logs):
    group = _group(logs)
    _put(logs, group, "job/algo-1-1700000000", ["x"])
    sleeps = []
    client = ThrottlingLogs(logs, throttle_calls=range(1, 100))
    tail = LogTail(client, group, "job/", sleep=sleeps.append, max_backoff_s=8)
    with pytest.raises(ClientError, match="ThrottlingException"):
        tail.poll()
    assert sleeps == [1.0, 2.0, 4.0, 8.0]


def test_other_errors_are_not_retried(logs):
    class Broken(ThrottlingLogs):
        def get_log_events(self, **kwargs):
            raise ClientError({"Error": {"Code": "AccessDeniedException", "Message": "no"}},
                              "GetLogEvents")

    group = _group(logs)
    _put(logs, group, "job/algo-1-1700000000", ["x"])
    sleeps = []
    with pytest.raises(ClientError, match="AccessDenied"):
        LogTail(Broken(logs, ()), group, "job/", sleep=sleeps.append).poll()
    assert sleeps == []


def _step(i, loss):
    return lf.format_step(lf.StepRecord(i, loss, 3e-4, 1.0, 1e5, 1.25e4, 300.0, 0.13, 60.0,
                                        70.0, "fp8", False))


def test_parse_training_job_reads_hosts_and_restarts_in_start_order(backend):
    logs = backend.client("logs")
    try:
        logs.create_log_group(logGroupName=TRAINING_JOBS_LOG_GROUP)
    except ClientError:
        pass
    job = f"sweep-fp8-{next(_names)}"
    first = [lf.format_recipe(lf.RecipeRecord("fp8", "DelayedScaling", "te", False))]
    first += [_step(i, 3.0) for i in range(1, 11)]
    first += [lf.format_json("event", {"kind": "sigterm", "message": "spot interruption"})]
    # the restarted host's stream sorts before the first one by name, not by start time
    second = [lf.format_json("checkpoint", {"action": "resumed", "step": 8, "path": "s3://b/8"})]
    second += [_step(i, 2.0) for i in range(9, 21)]
    second += [lf.format_json("summary", {"status": "completed", "steps": 20})]
    now = int(time.time() * 1000)
    # the restart's stream is written first here: the parser orders streams by start time
    _put(logs, TRAINING_JOBS_LOG_GROUP, f"{job}/algo-1-1700003600", second, start_ms=now)
    _put(logs, TRAINING_JOBS_LOG_GROUP, f"{job}/algo-1-1700000000", first, start_ms=now - 9000)
    _put(logs, TRAINING_JOBS_LOG_GROUP, f"{job}/algo-2-1700000000", ["[rank 8] NCCL INFO hi"],
         start_ms=now - 9000)
    parsed, tail = parse_training_job(job, logs=logs, page_limit=5)
    assert parsed.series["step"] == list(range(1, 21))
    assert parsed.series["loss"][8:] == [2.0] * 12  # the restarted run's values won
    assert parsed.summary["status"] == "completed"
    assert parsed.event_counts["restart"] >= 2 and parsed.event_counts["sigterm"] == 1
    assert len(parsed.streams) == 3 and tail.requests > 3


def test_parse_training_job_refuses_a_bad_name_before_any_call_and_a_job_without_logs(backend):
    with pytest.raises(UserError, match="job_name"):
        parse_training_job("bad_name!", logs=object())
    with pytest.raises(UserError, match="no CloudWatch log stream"):
        parse_training_job("never-ran-1", logs=backend.client("logs"))
