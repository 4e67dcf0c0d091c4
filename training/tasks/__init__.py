"""Verifiable task suites for post-training: seeded generators with train / held-out splits and verifiers
that return a binary reward and a reason. One module per domain; `SUITES` maps domain -> suite."""
