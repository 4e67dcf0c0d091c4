"""General RL rewards (docs/recipe.md, Stage 3): rule-based rewards, an outcome reward model (scalar, trained on
preference pairs), a generative reward model (the LLM judge with a rubric) and exemplar style anchors, combined
per objective dimension by `hybrid.HybridReward`."""
