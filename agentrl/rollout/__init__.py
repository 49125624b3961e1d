"""Rollouts: which prompts each rollout takes (source)."""
