"""Lints the shipped IAM policies with parliament (duo-labs): ``make lint`` runs it.

The policies are templates (``${REGION}``, ``${ACCOUNT_ID}``, ...); each is rendered
with example values by ``kfp_sagemaker_blackwell.iam.policy`` (what a user's ``envsubst``
produces), then analysed by parliament. Any finding fails the lint, except those
listed in ``ACCEPTED`` with the reason they are by design.

    python iam/lint.py          # exit 1 and the findings when there are any
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kfp_sagemaker_blackwell.iam import policy as iam_policy  # noqa: E402

EXAMPLE = {"account_id": "123456789012", "region": "us-west-2", "bucket": "example-bucket",
           "s3_prefix": "kfp-sagemaker/"}
# (policy, issue, detail substring) -> why the finding is by design.
ACCEPTED: dict[tuple[str, str, str], str] = {}


def findings(name: str) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # parliament imports the deprecated pkg_resources
        from parliament import analyze_policy_string

    policy = iam_policy.load_policy(name, **EXAMPLE)
    analysed = analyze_policy_string(json.dumps(policy, indent=2))
    out = []
    for f in analysed.findings:
        key = (name, f.issue, "")
        if any(k[:2] == key[:2] and k[2] in str(f.detail) for k in ACCEPTED):
            continue
        out.append(f"{iam_policy.POLICIES[name]}: {f.severity} {f.issue}: {f.title} "
                   f"{f.detail} {f.location}")
    return out


def main() -> int:
    names = [n for n in iam_policy.POLICIES if not n.endswith("-trust")]
    problems = [line for name in names for line in findings(name)]
    for line in problems:
        print(line)
    print(f"parliament: {len(names)} policies, {len(problems)} finding(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
