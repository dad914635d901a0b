"""parse_logs: a training job's logs -> metrics, per-step series, events, Markdown.

``from kfp_sagemaker_blackwell.components.parse_logs import parse_logs`` gives the KFP component (it loads
kfp); the parsing modules (``parser``, ``analysis``, ``series``, ``source``,
``report``) import neither kfp nor boto3 until they need them.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "parse_logs":
        from kfp_sagemaker_blackwell.components.parse_logs.component import parse_logs

        return parse_logs
    raise AttributeError(name)
