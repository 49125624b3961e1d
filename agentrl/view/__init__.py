"""`agentrl view`: a run's (or an eval's) attempts as a static HTML site, for people to read.

read.py finds a run's committed attempts and reads their samples, traces and results; model.py is
what a listing shows of them; conversation.py turns a sample's tokens into turns and marked tokens;
pages.py renders pages (templates/*.html, assets.py); site.py writes them incrementally; cli.py is the
command (docs/view.md).
"""
