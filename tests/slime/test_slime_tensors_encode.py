"""The live-tensor path's per-rank encoding: device tensors give the bytes host tensors give.

slime's ranks hand their chunks to core's :class:`~cwtrain.hotload.RankShare` (host copies of
the served weights) and publish through :func:`~cwtrain.hotload.publish_spmd` over slime's
collective; these tests hold the rank side to it.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")


def _weights(device: str) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn((64, 32), generator=gen).to(torch.bfloat16).to(device),
        "b.weight": torch.randn((128,), generator=gen).to(device),
        "c.bias": torch.zeros((16,), dtype=torch.float16).to(device),
    }


def _encoded_bytes(device: str) -> tuple[list[bytes], dict[str, Any], list[str]]:
    from cwtrain.hotload import RankShare, SharePlan

    base = _weights(device)
    share = RankShare()
    share.seed(base)
    new = {name: tensor.clone() for name, tensor in base.items()}
    new["a.weight"][3, 4] += 1
    new["b.weight"][0] = 7.0
    encoded = share.encode(SharePlan("run-v000001", False, "run-v000000", "b", "p"), [list(new.items())])
    return [f.tobytes() for f in encoded.files], encoded.weight_map, sorted(encoded.weight_map)


def test_cpu_tensors_encode_only_changed_tensors() -> None:
    files, weight_map, changed = _encoded_bytes("cpu")
    assert changed == ["a.weight", "b.weight"] and sorted(weight_map) == changed
    assert len(files) == 1


def test_served_copy_is_never_a_view_of_the_parameters() -> None:
    from cwtrain.hotload import host_copy

    parameter = torch.ones(8)
    copy = host_copy("p", parameter)
    parameter.add_(1.0)  # an in-place optimizer step
    assert bytes(copy.data) == torch.ones(8).numpy().tobytes()


@pytest.mark.gpu
def test_device_tensors_encode_to_the_same_bytes_as_host_tensors() -> None:
    assert _encoded_bytes("cuda") == _encoded_bytes("cpu")


def test_an_encoding_failure_on_one_rank_raises_on_every_rank(recording_loader: Any) -> None:
    import threading

    from cwtrain.errors import CWTrainError
    from cwtrain.integrations.slime import HookConfig
    from cwtrain.integrations.slime.tensors import TensorPublisher

    barrier = threading.Barrier(2)
    slots: list[Any] = [None, None]

    class View:
        world_size = 2

        def __init__(self, rank: int) -> None:
            self.rank = rank

        def all_gather_object(self, obj: Any) -> list[Any]:
            barrier.wait()
            slots[self.rank] = obj
            barrier.wait()
            out = list(slots)
            barrier.wait()
            return out

        def broadcast_object(self, obj: Any, src: int = 0) -> Any:
            return self.all_gather_object(obj)[src]

    errors: dict[int, BaseException] = {}

    def rank_main(rank: int) -> None:
        config = HookConfig("dep-1", "run", full_every=0)
        publisher = TensorPublisher(config, View(rank), loader=recording_loader if rank == 0 else None)
        publisher.share.seed({f"r{rank}.weight": torch.zeros(4)})
        publisher.seeded = True
        if rank == 0:  # as the baseline leaves rank 0's session
            publisher.publisher.session.served_identity = "run-v000000"
            publisher.publisher.session.cadence.published(full=True)
        new = {f"r{rank}.weight": torch.zeros(5 if rank == 1 else 4)}  # rank 1's shape changed: no delta
        try:
            publisher.publish(None, new.items())
        except BaseException as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(t.is_alive() for t in threads)  # nobody left waiting in a collective
    assert set(errors) == {0, 1}
    assert all(isinstance(e, CWTrainError) and "rank 1" in str(e) for e in errors.values())
    assert recording_loader.published == []  # nothing committed
