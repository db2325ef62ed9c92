"""Rollout workers: the vLLM engine actor and the agent loop that turns model output into tool calls."""
