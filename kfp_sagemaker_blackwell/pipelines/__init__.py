"""The pipelines: the precision sweep, batch tuning and plan-and-train, compiled and run locally."""
