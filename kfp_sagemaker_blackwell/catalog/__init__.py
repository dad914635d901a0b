"""The facts every side shares, torch-free, on the ground floor of the import graph.

The trainer, the components, the local backend and the pipelines all read these; the
catalog imports nothing of the project and only the standard library
(tests/test_structure.py), so the trainer image carries it beside ``trainer/``.

- ``hardware``: GPU datasheets, SageMaker instance types with their shipped prices and
  the prices' sources, the default instance type;
- ``precisions``: the precisions, their TransformerEngine recipes, the compute
  capability each needs, and their risk order;
- ``spec``: ``ModelSpec`` (the model's dimensions) and the model presets;
- ``flags``: the trainer's flag table (``TrainConfig``), which the launcher checks
  hyperparameters against;
- ``parameters``: the parameter groups several components and pipelines declare (the model,
  encryption, a pipeline's run...), each group's names, kinds, defaults and help written once;
- ``logformat``: the trainer's log lines, written by the trainer, read by the parsers;
- ``bounds``: valid ranges of numeric options and the one "unknown name" message;
- ``paths``: the argparse types of every command line's path options (a file written,
  a file read, a folder written into), checked while parsing;
- ``tokens``: the trainer's token-file format and its one check (the trainer at start-up,
  the launcher for a directory it can reach);
- ``sagemaker``: SageMaker's facts the sides share (the default max runtime, what an
  image reference is);
- ``release``: the package's version (the components image's tag).
"""
