"""What travels between the grader and a submission's kernel: plain data only, in size-limited frames.

A frame is an 8-byte length followed by ``torch.save`` bytes, read back with
``torch.load(weights_only=True)``: tensors, numbers, strings, bytes, lists, tuples, dicts, sets, dtypes, devices
and two marker classes of this module. Nothing the kernel sends can run code in the grader.

* ``Ref(n)``: an object that stays on the side that owns it (the checker's model, a cache, a
  policy); the other side can only call it, read its public attributes, index it or take its length.
* ``Opaque(type_name, text)``: a value that is not plain data (a generator, a custom object): the
  checker receives this marker, which compares equal to nothing, so the answer is simply wrong.
"""

from __future__ import annotations

import io
import numbers
import socket
import struct
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Ref", "Opaque", "WireError", "MAX_FRAME", "send", "recv", "to_plain"]

MAX_FRAME = 64 * 2**20  # bytes of one message (a tensor of 16 M floats)
MAX_DEPTH = 32
_HEADER = struct.Struct(">Q")


class WireError(RuntimeError):
    """The other side sent something that is not a valid message (or nothing, in time)."""


class Ref:
    """A handle to an object kept by the side that sent it."""

    __slots__ = ("id",)

    def __init__(self, id: int) -> None:
        self.id = int(id)

    def __reduce__(self):
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id})"


class Opaque:
    """Stands for a value that could not travel as plain data."""

    __slots__ = ("type_name", "text")

    def __init__(self, type_name: str, text: str) -> None:
        self.type_name, self.text = str(type_name)[:100], str(text)[:200]

    def __reduce__(self):
        return (Opaque, (self.type_name, self.text))

    def __repr__(self) -> str:
        return f"<{self.type_name} {self.text}>"


def to_plain(value: Any, export: Callable[[Any], Any], depth: int = 0) -> Any:
    """``value`` as plain data; every other object becomes ``export(obj)`` (a ``Ref`` or an ``Opaque``)."""
    if depth > MAX_DEPTH:
        return Opaque(type(value).__name__, "nested too deeply")
    if value is None or isinstance(value, (bool, str, bytes, torch.dtype, torch.device, Ref, Opaque)):
        return value
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized or value.device.type == "meta":
            return Opaque("Tensor", f"{value.layout} tensor")
        with torch.inference_mode(False):
            return value.detach().to("cpu").contiguous().clone()  # a copy: never a view of a larger storage
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, numbers.Complex):
        return complex(value)
    if isinstance(value, torch.Size):
        return torch.Size(int(v) for v in value)
    if isinstance(value, (list, tuple, range)):
        items = [to_plain(v, export, depth + 1) for v in value]
        return items if isinstance(value, (list, range)) else tuple(items)
    if isinstance(value, (set, frozenset)):
        items = [to_plain(v, export, depth + 1) for v in value]
        return set(items) if all(isinstance(v, (int, float, str, bytes, bool, type(None))) for v in items) else items
    if isinstance(value, dict):
        return {to_plain(k, export, depth + 1): to_plain(v, export, depth + 1) for k, v in value.items()}
    if type(value).__module__ == "numpy" and hasattr(value, "__array__"):
        try:
            return torch.as_tensor(value.__array__()).clone()
        except (TypeError, RuntimeError, ValueError):
            return Opaque(type(value).__name__, "numpy value of an unsupported dtype")
    return export(value)


def send(sock: socket.socket, message: Any) -> None:
    """Send one message (already plain data)."""
    buffer = io.BytesIO()
    torch.save(message, buffer)
    payload = buffer.getvalue()
    if len(payload) > MAX_FRAME:
        raise WireError(f"message of {len(payload)} bytes is over the {MAX_FRAME}-byte limit")
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise WireError("the connection was closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> Any:
    """Receive one message; ``WireError`` on a closed connection, an oversized or an unsafe message."""
    (size,) = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    if size > MAX_FRAME:
        raise WireError(f"message of {size} bytes is over the {MAX_FRAME}-byte limit")
    payload = _recv_exactly(sock, size)
    try:
        with torch.serialization.safe_globals([Ref, Opaque]):
            return torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as e:  # anything but plain data is refused by the weights-only unpickler
        raise WireError(f"not a plain-data message ({type(e).__name__})") from None
