"""The live backend of the driver loop: the event loop on real workers (rollout, roles,
training and weight sync, faults), Ray placement and resumable checkpoints."""
