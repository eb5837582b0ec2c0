"""``local-s3``: the local stack's object store answers as S3 does where cwtrain relies on it.

moto's S3 server answered 500 (a ``KeyError``) where S3 answers 404 ``NoSuchUpload``, could
list the MD5 of nothing as a part's ETag while that part's upload was answering, and checked
no signature (a wrong secret key published fine). The stack's store
(:class:`~cwtrain.local.harness.objectstore.MotoS3Server`, through
:mod:`cwtrain.local.harness.moto_s3`) answers ``NoSuchUpload`` with 404, lists each part's
ETag as the MD5 of its bytes, and refuses a request not signed with its keys as S3 does
(``InvalidAccessKeyId``, ``SignatureDoesNotMatch``, ``AccessDenied``), checked here over HTTP
and, for the race, deterministically in process.
"""

from __future__ import annotations

import hashlib
import os
import threading
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from _s3_proxy import S3Proxy
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

from cwtrain.infra.objectstore import AccessDeniedError
from cwtrain.infra.s3 import object_store
from cwtrain.local.harness.objectstore import DEFAULT_REGION

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


# ------------------------------------------------------------------------ credentials

_SIGNATURE_MESSAGE = (
    "The request signature we calculated does not match the signature you provided. Check your key and signing method."
)
_KEY_MESSAGE = "The AWS Access Key Id you provided does not exist in our records."


def _client(server: Any, *, access: str | None = None, secret: str | None = None, unsigned: bool = False) -> Any:
    """A boto3 client for ``server`` with the given keys (the server's own where not given), not retrying."""
    keys = server.credentials
    return boto3.client(
        "s3",
        endpoint_url=server.endpoint_url,
        region_name=DEFAULT_REGION,
        aws_access_key_id=access or keys["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=secret or keys["AWS_SECRET_ACCESS_KEY"],
        config=Config(
            signature_version=UNSIGNED if unsigned else "s3v4",
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1},
        ),
    )


def _refused(call: Callable[[], Any]) -> tuple[int, str, str]:
    with pytest.raises(ClientError) as info:
        call()
    response = info.value.response
    error = response["Error"]
    return int(response["ResponseMetadata"]["HTTPStatusCode"]), str(error.get("Code")), str(error.get("Message"))


def test_the_stores_keys_sign_odd_keys_listings_copies_and_presigned_urls(s3_bucket: tuple[Any, str]) -> None:
    s3, bucket = s3_bucket
    keys = ["a/b c+d/\u00e9 x.bin", "p/q=r&s;t", "~t*(x)!'", "sp ace/%41"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"body", Metadata={"with_underscore": "a  b"})
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"body"
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="a/b c+d/", Delimiter="/")
    assert [o["Key"] for o in listed["Contents"]] == [keys[0]]
    s3.copy_object(Bucket=bucket, Key="copy of p", CopySource={"Bucket": bucket, "Key": keys[1]})
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": keys[0]}, ExpiresIn=60)
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.read() == b"body"


def test_a_wrong_key_or_no_signature_is_refused_as_s3_refuses_it(s3_server: Any, s3_bucket: tuple[Any, str]) -> None:
    _, bucket = s3_bucket
    wrong_secret = _client(s3_server, secret="not-the-secret")
    wrong_key = _client(s3_server, access="AKIAEXAMPLEEXAMPLE00")
    unsigned = _client(s3_server, unsigned=True)
    assert _refused(lambda: wrong_secret.list_objects_v2(Bucket=bucket)) == (
        403,
        "SignatureDoesNotMatch",
        _SIGNATURE_MESSAGE,
    )
    assert _refused(lambda: wrong_key.list_objects_v2(Bucket=bucket)) == (403, "InvalidAccessKeyId", _KEY_MESSAGE)
    assert _refused(lambda: unsigned.list_objects_v2(Bucket=bucket)) == (403, "AccessDenied", "Access Denied")
    body = os.urandom(2 * MIB)  # a body the server must read past to answer
    put = _refused(lambda: wrong_secret.put_object(Bucket=bucket, Key="k", Body=body))
    assert put == (403, "SignatureDoesNotMatch", _SIGNATURE_MESSAGE)
    assert _refused(lambda: wrong_secret.head_object(Bucket=bucket, Key="k"))[:2] == (403, "403")  # HEAD: no body
    assert "Contents" not in s3_bucket[0].list_objects_v2(Bucket=bucket)
    # S3's XML error body, with a request id; moto's own endpoints stay open
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"{s3_server.endpoint_url}/{bucket}?list-type=2", timeout=10)
    error = ET.fromstring(anonymous.value.read())
    assert anonymous.value.code == 403 and error.tag == "Error"
    assert (error.findtext("Code"), error.findtext("Message")) == ("AccessDenied", "Access Denied")
    assert error.findtext("RequestId") == anonymous.value.headers["x-amz-request-id"]
    with urllib.request.urlopen(f"{s3_server.endpoint_url}/moto-api/", timeout=10) as answer:
        assert answer.status == 200


def test_through_a_proxy_the_host_as_received_is_checked_and_a_refusal_is_not_retried(
    s3_server: Any, s3_bucket: tuple[Any, str], s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, bucket = s3_bucket
    with S3Proxy(s3_server.endpoint_url) as proxy:
        store = object_store(proxy.endpoint_url)  # cwtrain's client: adaptive retries, UNSIGNED-PAYLOAD
        store.put(bucket, "via proxy/k+1", b"x" * 1000, sha256=hashlib.sha256(b"x" * 1000).hexdigest())
        assert [o.key for o in store.list_objects(bucket, "via proxy/")] == ["via proxy/k+1"]
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        with pytest.raises(AccessDeniedError) as refused:
            object_store(proxy.endpoint_url).list_objects(bucket, "via proxy/")
        assert proxy.count("ListObjectsV2") == 2  # the good one, and the refused one once
    assert refused.value.code == "SignatureDoesNotMatch"
    assert str(refused.value) == (
        f"the object store at {proxy.endpoint_url} refused the credentials (SignatureDoesNotMatch on "
        f"ListObjectsV2: {_SIGNATURE_MESSAGE}); check AWS_SECRET_ACCESS_KEY: it must be the secret key of "
        "AWS_ACCESS_KEY_ID"
    )
