"""moto's S3 server, answering as S3 does where cwtrain relies on it: ``python -m cwtrain.local.harness.moto_s3``.

:class:`~cwtrain.local.harness.objectstore.MotoS3Server` runs this module instead of
``python -m moto.server`` (same options). It applies :func:`conform` and then runs moto's
server unchanged. What differs from moto 5 as it comes, and why cwtrain cares:

- **NoSuchUpload.** ``UploadPart``, ``UploadPartCopy`` and ``CompleteMultipartUpload`` of an
  upload id that is not open (aborted, completed, never made) answer 404 ``NoSuchUpload``, as
  S3 does; moto answers 500 (a ``KeyError``), which a client retries as a transient error
  instead of restarting the upload.
- **Part ETags.** A part's ETag (the MD5 of its bytes) is computed under the part's lock.
  moto computes it lazily from a buffer that concurrent requests share (seek, then read), so
  a ``ListParts`` while the same part's ``UploadPart`` answers could list the MD5 of nothing
  (``d41d8cd9...``) or of a part of the bytes, and keep it. A resumed upload compares these
  ETags with the local bytes.

Each patch checks that moto still has what it patches, so a moto that changed fails at
start instead of silently serving moto's own answers.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["conform", "main"]

_APPLIED = False


def _needs_open_upload(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method(self, bucket_name, multipart_id, ...)`` raising NoSuchUpload for an upload that is not open."""
    from moto.s3.exceptions import NoSuchUpload

    @functools.wraps(method)
    def checked(self: Any, bucket_name: str, multipart_id: str, *args: Any, **kwargs: Any) -> Any:
        if multipart_id not in self.get_bucket(bucket_name).multiparts:
            raise NoSuchUpload(upload_id=multipart_id)
        return method(self, bucket_name, multipart_id, *args, **kwargs)

    return checked


def _locked_etag(etag: property) -> property:
    """The ``etag`` property of moto's keys, computed while holding the key's lock."""
    compute = etag.fget
    assert compute is not None

    def locked(self: Any) -> str:
        lock = getattr(self, "lock", None)
        if lock is None:
            return str(compute(self))
        with lock:
            return str(compute(self))

    return property(locked, doc="The key's ETag (the MD5 of its bytes), computed under its lock.")


def conform() -> None:
    """Patch moto's S3 backend in this process (idempotent); see the module docstring.

    Raises:
        RuntimeError: moto lacks what is patched (another moto than the 5.x this was written for).
    """
    global _APPLIED
    if _APPLIED:
        return
    from moto.s3 import models

    backend, key = getattr(models, "S3Backend", None), getattr(models, "FakeKey", None)
    methods = ("upload_part", "upload_part_copy", "complete_multipart_upload")
    if backend is None or key is None or not all(callable(getattr(backend, m, None)) for m in methods):
        raise RuntimeError("moto.s3.models has no S3Backend upload methods or FakeKey: cannot make it answer as S3")
    if not isinstance(key.__dict__.get("etag"), property):
        raise RuntimeError("moto.s3.models.FakeKey.etag is not a property: cannot make part ETags safe")
    for name in methods:
        setattr(backend, name, _needs_open_upload(getattr(backend, name)))
    key.etag = _locked_etag(key.__dict__["etag"])
    _APPLIED = True


def main(argv: Sequence[str] | None = None) -> None:
    """Run moto's server (its own options: ``-H HOST -p PORT``) with :func:`conform` applied."""
    conform()
    from moto.server import main as moto_main

    moto_main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
