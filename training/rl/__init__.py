"""Reinforcement learning for post-training: the losses (pure tensor functions, one per equation of the
recipe) and the loops that feed them."""
