"""Agentic RL: task families, their services, the orchestrator, routing, the TITO gateway, the async loop."""
