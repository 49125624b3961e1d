"""GRPO training: advantages, batch schedule and policy loss."""
