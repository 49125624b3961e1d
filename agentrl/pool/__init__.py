"""Rollouts: the pool worker, one attempt, rollout metrics."""
