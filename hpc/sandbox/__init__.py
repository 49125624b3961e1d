"""Sandboxes that run task images: bubblewrap (here and on laptops), Apptainer (clusters), local (development).

All runtimes implement the async `Sandbox` protocol of `hpc.sandbox.base`.
"""
