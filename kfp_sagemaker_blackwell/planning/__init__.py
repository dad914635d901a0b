"""The plan's domain models, torch-free: training setup, memory estimate and planner,
throughput, prices and cost, precision risk (issue 27: not plumbing, not a component)."""
