"""Rollouts for every RL stage: the trajectory record, engines that return token ids with per-token
log-probs (a local batched KV-cache sampler, an OpenAI-compatible HTTP backend), and the multi-turn loop."""
