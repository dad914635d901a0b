"""Pre-ranks batch-tuning candidates with probes, before any trial is paid for."""
