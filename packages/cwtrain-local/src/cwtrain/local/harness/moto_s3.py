"""moto's S3 server, answering as S3 does where cwtrain relies on it: ``python -m cwtrain.local.harness.moto_s3``.

:class:`~cwtrain.local.harness.objectstore.MotoS3Server` runs this module instead of
``python -m moto.server`` (its ``-H HOST -p PORT`` options), with the one key pair the
store accepts in :data:`ACCESS_KEY_VARIABLE` and :data:`SECRET_KEY_VARIABLE`. It applies
:func:`conform` and serves moto's application behind the signature check of
:mod:`cwtrain.local.harness.s3_auth`. What differs from moto 5 as it comes, and why cwtrain
cares:

- **Credentials.** A request on a bucket path must carry a SigV4 signature made with the
  store's keys: an unknown access key is 403 ``InvalidAccessKeyId``, a wrong secret 403
  ``SignatureDoesNotMatch``, no signature 403 ``AccessDenied``, as S3 answers. moto
  checks no signature, so a wrong secret key published fine locally and failed first on
  the real bucket.

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

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ACCESS_KEY_VARIABLE", "SECRET_KEY_VARIABLE", "conform", "main"]

#: The variables that give the server the one access key id and secret it accepts.
ACCESS_KEY_VARIABLE = "CWTRAIN_LOCAL_S3_ACCESS_KEY_ID"
SECRET_KEY_VARIABLE = "CWTRAIN_LOCAL_S3_SECRET_ACCESS_KEY"

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
    """Serve moto's S3 (``-H HOST -p PORT``, as moto's server takes them) with :func:`conform`
    applied, answering only requests signed with the keys of :data:`ACCESS_KEY_VARIABLE` and
    :data:`SECRET_KEY_VARIABLE`."""
    parser = argparse.ArgumentParser(prog="python -m cwtrain.local.harness.moto_s3")
    parser.add_argument("-H", "--host", default="127.0.0.1", help="the address to bind")
    parser.add_argument("-p", "--port", type=int, default=5000, help="the port to listen on")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    access_key, secret_key = os.environ.get(ACCESS_KEY_VARIABLE), os.environ.get(SECRET_KEY_VARIABLE)
    if not access_key or not secret_key:
        parser.error(f"set {ACCESS_KEY_VARIABLE} and {SECRET_KEY_VARIABLE} to the key pair the store accepts")
    conform()
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    from cwtrain.local.harness.s3_auth import require_signature

    os.environ.setdefault("MOTO_PORT", str(args.port))  # moto names its own port in some answers
    app = require_signature(DomainDispatcherApplication(create_backend_app), access_key, secret_key)
    run_simple(args.host, args.port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
