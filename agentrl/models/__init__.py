"""Model assets: the chat template contract and a tiny offline model for tests."""
