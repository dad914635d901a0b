"""Ranks training runs by throughput (batch-size / checkpointing tuning)."""
