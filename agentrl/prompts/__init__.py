"""Prompts: the data's rows, which rows each rollout takes (source), what each group is (groups).

Shared by the trainer, which decides, and the pool, which reads the decision; neither imports the other.
"""
