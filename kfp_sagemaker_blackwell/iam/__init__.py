"""The IAM policies this project ships (``iam/*.json``), their offline evaluator
(``policy``) and their lint (``python -m kfp_sagemaker_blackwell.iam.lint``)."""
