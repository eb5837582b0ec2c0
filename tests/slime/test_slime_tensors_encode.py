"""The live-tensor path's per-rank encoding: device tensors give the bytes host tensors give."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")


def _publisher(served: dict[str, Any]) -> Any:
    from cwtrain.integrations.slime import HookConfig
    from cwtrain.integrations.slime.tensors import TensorPublisher, _host_copy

    publisher = TensorPublisher(HookConfig("dep", "run", full_every=0))
    publisher.served = {name: _host_copy(name, tensor) for name, tensor in served.items()}
    return publisher


def _weights(device: str) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn((64, 32), generator=gen).to(torch.bfloat16).to(device),
        "b.weight": torch.randn((128,), generator=gen).to(device),
        "c.bias": torch.zeros((16,), dtype=torch.float16).to(device),
    }


def _encoded_bytes(device: str) -> tuple[list[bytes], dict[str, Any], list[str]]:
    base = _weights(device)
    publisher = _publisher(base)
    new = {name: tensor.clone() for name, tensor in base.items()}
    new["a.weight"][3, 4] += 1
    new["b.weight"][0] = 7.0
    snap, files, weight_map = publisher._encode([list(new.items())], full=False)
    return [f.tobytes() for f in files], weight_map, snap.changed


def test_cpu_tensors_encode_only_changed_tensors() -> None:
    files, weight_map, changed = _encoded_bytes("cpu")
    assert changed == ["a.weight", "b.weight"] and sorted(weight_map) == changed
    assert len(files) == 1


def test_served_copy_is_never_a_view_of_the_parameters() -> None:
    from cwtrain.integrations.slime.tensors import _host_copy

    parameter = torch.ones(8)
    copy = _host_copy("p", parameter)
    parameter.add_(1.0)  # an in-place optimizer step
    assert bytes(copy.data) == torch.ones(8).numpy().tobytes()


@pytest.mark.gpu
def test_device_tensors_encode_to_the_same_bytes_as_host_tensors() -> None:
    assert _encoded_bytes("cuda") == _encoded_bytes("cpu")


def test_an_encoding_failure_on_one_rank_raises_on_every_rank() -> None:
    import threading

    from cwtrain.errors import CWTrainError
    from cwtrain.integrations.slime import HookConfig
    from cwtrain.integrations.slime.tensors import TensorPublisher, _host_copy

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
        publisher = TensorPublisher(HookConfig("dep", "run", full_every=0), View(rank))
        base = {f"r{rank}.weight": torch.zeros(4)}
        publisher.served = {n: _host_copy(n, t) for n, t in base.items()}
        publisher.served_identity = "run-v000000"
        publisher.cadence.published(full=True)  # as the baseline does
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
