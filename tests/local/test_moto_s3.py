"""``local-s3``: the local stack's object store answers as S3 does where cwtrain relies on it.

moto's S3 server answered 500 (a ``KeyError``) where S3 answers 404 ``NoSuchUpload``, and could
list the MD5 of nothing as a part's ETag while that part's upload was answering. The stack's
store (:class:`~cwtrain.local.harness.objectstore.MotoS3Server`, through
:mod:`cwtrain.local.harness.moto_s3`) answers ``NoSuchUpload`` with 404 and lists each part's
ETag as the MD5 of its bytes, checked here over HTTP and, for the race, deterministically in
process.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

import pytest
from botocore.exceptions import ClientError

pytestmark = [pytest.mark.faults, pytest.mark.fault_row("local-s3")]

MIB = 1 << 20


def _refusal(call: Any) -> tuple[int, str]:
    with pytest.raises(ClientError) as info:
        call()
    response = info.value.response
    return int(response["ResponseMetadata"]["HTTPStatusCode"]), str(response["Error"].get("Code"))


def test_an_upload_that_is_not_open_is_no_such_upload(s3_bucket: tuple[Any, str]) -> None:
    s3, bucket = s3_bucket
    s3.put_object(Bucket=bucket, Key="source", Body=b"s" * 16)
    aborted = s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    s3.abort_multipart_upload(Bucket=bucket, Key="k", UploadId=aborted)
    for upload_id in ("never-made", aborted):
        part = {"Bucket": bucket, "Key": "k", "UploadId": upload_id, "PartNumber": 1}
        calls = {
            "UploadPart": lambda part=part: s3.upload_part(**part, Body=b"x"),
            "UploadPartCopy": lambda part=part: s3.upload_part_copy(
                **part, CopySource={"Bucket": bucket, "Key": "source"}
            ),
            "CompleteMultipartUpload": lambda upload_id=upload_id: s3.complete_multipart_upload(
                Bucket=bucket, Key="k", UploadId=upload_id, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": "x"}]}
            ),
            "ListParts": lambda upload_id=upload_id: s3.list_parts(Bucket=bucket, Key="k", UploadId=upload_id),
            "AbortMultipartUpload": lambda upload_id=upload_id: s3.abort_multipart_upload(
                Bucket=bucket, Key="k", UploadId=upload_id
            ),
        }
        for name, call in calls.items():
            assert _refusal(call) == (404, "NoSuchUpload"), (upload_id, name)
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="k")


def test_parts_listed_during_their_upload_carry_the_md5_of_their_bytes(s3_bucket: tuple[Any, str]) -> None:
    s3, bucket = s3_bucket
    upload = s3.create_multipart_upload(Bucket=bucket, Key="big")["UploadId"]
    parts = [os.urandom(6 * MIB) for _ in range(4)]  # past moto's in-memory buffer: read from a file
    md5 = {number: hashlib.md5(body).hexdigest() for number, body in enumerate(parts, 1)}
    seen: list[tuple[int, str]] = []
    stop = threading.Event()

    def lister() -> None:
        while not stop.is_set():
            for part in s3.list_parts(Bucket=bucket, Key="big", UploadId=upload).get("Parts", []):
                seen.append((int(part["PartNumber"]), part["ETag"].strip('"')))

    listers = [threading.Thread(target=lister) for _ in range(3)]
    for thread in listers:
        thread.start()
    try:
        answered = {
            number: s3.upload_part(Bucket=bucket, Key="big", UploadId=upload, PartNumber=number, Body=body)[
                "ETag"
            ].strip('"')
            for number, body in enumerate(parts, 1)
        }
    finally:
        stop.set()
        for thread in listers:
            thread.join()
    assert answered == md5
    assert seen and all(etag == md5[number] for number, etag in seen), [e for e in seen if e[1] != md5[e[0]]][:3]
    final = s3.list_parts(Bucket=bucket, Key="big", UploadId=upload)["Parts"]
    assert {int(p["PartNumber"]): p["ETag"].strip('"') for p in final} == md5
    s3.abort_multipart_upload(Bucket=bucket, Key="big", UploadId=upload)


def test_two_requests_computing_one_parts_etag_at_once_both_get_its_md5() -> None:
    """The race, made certain: both computations meet inside the buffer read (as two request
    threads of the server can); with the key's lock the second waits for the first."""
    from moto.s3.models import FakeKey

    from cwtrain.local.harness.moto_s3 import conform

    conform()
    body = b"part bytes " * 1000
    key = FakeKey("1", body, account_id="123456789012", region_name="us-east-1")
    buffer = key._value_buffer
    inside = threading.Barrier(2, timeout=0.5)

    class Rendezvous:
        """The key's buffer, whose first read of each thread waits for the other thread."""

        def __init__(self) -> None:
            self.waited: set[int] = set()

        def seek(self, offset: int, whence: int = 0) -> int:
            return int(buffer.seek(offset, whence))

        def read(self, size: int = -1) -> bytes:
            if threading.get_ident() not in self.waited:
                self.waited.add(threading.get_ident())
                try:
                    inside.wait()
                except threading.BrokenBarrierError:  # the other one waits for the lock: fine
                    pass
            return bytes(buffer.read(size))

    key._value_buffer = Rendezvous()
    etags: list[str] = []
    threads = [threading.Thread(target=lambda: etags.append(key.etag)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert etags == [f'"{hashlib.md5(body).hexdigest()}"'] * 2
