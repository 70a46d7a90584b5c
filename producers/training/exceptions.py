"""Classify a training exception: CUDA error, NCCL error/timeout, out of memory, connection, other.

The classes follow what the decision engine does with them (see
``shared/DESIGN.md``): a CUDA error or illegal memory access restarts the
process, an NCCL timeout or a reset connection is retried in place, an out of
memory is reported for a human or a re-plan. Classification looks at the
exception class (and its bases) and then at the message, since PyTorch wraps
most backend failures in ``RuntimeError`` / ``DistBackendError`` and says what
happened only in the text.
"""

from __future__ import annotations

import re

__all__ = ["classify_exception", "classify_text"]

# Order matters: the first match wins.
_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("out_of_memory", re.compile(r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|OutOfMemoryError", re.I)),
    ("nccl_timeout", re.compile(r"(NCCL|ProcessGroup\w*|collective).{0,200}time[d ]?out|Watchdog caught collective operation timeout", re.I | re.S)),
    ("nccl_error", re.compile(r"\bNCCL\b|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclRemoteError|ProcessGroupNCCL", re.I)),
    ("illegal_memory_access", re.compile(r"illegal memory access|cudaErrorIllegalAddress|misaligned address", re.I)),
    ("cuda_error", re.compile(r"\bCUDA error\b|\bCUDA\b.*\bfailed\b|cudaError\w*|CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|device-side assert", re.I)),
    ("connection_reset", re.compile(r"Connection reset by peer|Connection closed by peer|ECONNRESET|Broken pipe", re.I)),
    ("connection_refused", re.compile(r"Connection refused|ECONNREFUSED", re.I)),
)

_BY_CLASS = {
    "OutOfMemoryError": "out_of_memory",  # torch.cuda.OutOfMemoryError, torch.OutOfMemoryError
    "MemoryError": "out_of_memory",
    "ConnectionResetError": "connection_reset",
    "BrokenPipeError": "connection_reset",
    "ConnectionRefusedError": "connection_refused",
}


def classify_text(text: str) -> str:
    """Category of an error message alone.

    >>> classify_text("CUDA out of memory. Tried to allocate 2.00 GiB")
    'out_of_memory'
    >>> classify_text("NCCL error in: ProcessGroupNCCL.cpp:1275, unhandled system error")
    'nccl_error'
    >>> classify_text("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE) ran for 1800000 milliseconds before timing out.")
    'nccl_timeout'
    >>> classify_text("CUDA error: an illegal memory access was encountered")
    'illegal_memory_access'
    >>> classify_text("CUDA error: unspecified launch failure")
    'cuda_error'
    >>> classify_text("division by zero")
    'other'
    """
    for category, pattern in _RULES:
        if pattern.search(text):
            return category
    return "other"


def classify_exception(exc: BaseException) -> str:
    """Category of an exception: its class hierarchy first, then its message (and its causes').

    >>> classify_exception(MemoryError())
    'out_of_memory'
    >>> classify_exception(RuntimeError("NCCL communicator was aborted on rank 1"))
    'nccl_error'
    >>> classify_exception(ValueError("bad shape"))
    'other'
    """
    for cls in type(exc).__mro__:
        if cls.__name__ in _BY_CLASS:
            return _BY_CLASS[cls.__name__]
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        category = classify_text(f"{type(e).__name__}: {e}")
        if category != "other":
            return category
        e = e.__cause__ or e.__context__
    return "other"
