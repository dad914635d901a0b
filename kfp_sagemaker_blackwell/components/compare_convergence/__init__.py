"""compare_convergence: a precision sweep's series -> verdicts, recommendation, HTML report.

``from kfp_sagemaker_blackwell.components.compare_convergence import compare_convergence`` gives the KFP
component (it loads kfp); ``compare``, ``report`` and ``run`` are plain modules
(numpy; matplotlib only when the report is drawn).
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "compare_convergence":
        from kfp_sagemaker_blackwell.components.compare_convergence.component import (
            compare_convergence,
        )

        return compare_convergence
    raise AttributeError(name)
