"""The FSDP2 + TransformerEngine trainer the training jobs run (the image runs train.sh)."""
