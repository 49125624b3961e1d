"""The adapter between agent CLIs and the SGLang model server."""
