"""kfp-sagemaker-blackwell's one import package.

Its subpackages are the repository's top-level folders (the design card's layout): in a checkout
each is a relative symbolic link to its folder (``components``, ``pipelines``, ``trainer``,
``catalog``, ``common``, ``planning``, ``local_backend``, ``iam``); the wheel holds the files
themselves; the trainer image holds ``trainer`` and ``catalog`` only. Import from here
(``from kfp_sagemaker_blackwell.components.sagemaker_training.component import ...``), never
from the folders' bare names, so that installing the package claims one top-level name.
"""
