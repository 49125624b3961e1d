"""Task images for sandboxes: OCI layouts and docker-archives read and verified (oci),
applied to a rootfs for bubblewrap (extract), kept in a content-addressed cache on the
shared filesystem (cache), built from any source, also as SIF, by hpc.images.build.

hpc.images.build is not imported here: `python -m hpc.images.build` would then run a module
that is already imported (runpy warns about it)."""

from .cache import Entry, ImageCache, ImageEntry
from .extract import extract_image
from .oci import Image, ImageError, open_image

__all__ = ["Entry", "Image", "ImageCache", "ImageEntry", "ImageError", "extract_image", "open_image"]
