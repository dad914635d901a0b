#!/usr/bin/env bash
# Here (a machine with the package registry), in the repository root: the wheels the GPU machine
# needs for gpu_toolkit_run.sh, in the git-ignored .smt/ (carry it: ".smt").
# The GPU machine's python3 is CPython 3.12 with torch, numpy, scipy, psutil, protobuf, six,
# werkzeug already there (/work/.library/device/KINDS.md); it has no registry access.
set -euo pipefail
PY312=${PY312:-python3.12}
exclude="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.smt/' "$exclude" 2>/dev/null || echo '/.smt/' >> "$exclude"
rm -rf .smt && mkdir -p .smt
# sagemaker-training is an sdist with a C extension (its gethostname override), inotify_simple
# 1.2.1 (the toolkit's pin) an sdist too: build both for 3.12.
"$PY312" -m pip wheel --no-deps -q -w .smt "sagemaker-training==5.1.4" "inotify_simple==1.2.1"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
# What the toolkit imports on the `train` path (boto3, paramiko, retrying, gevent, inotify_simple)
# and what those need, pinned as this project's constraints.txt pins boto3.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d .smt \
  boto3==1.44.5 botocore==1.44.5 s3transfer jmespath retrying \
  gevent greenlet zope.event zope.interface paramiko bcrypt cryptography pynacl cffi pycparser invoke
ls -la .smt
du -sh .smt
