"""torch.distributed's traffic, timed: the collectives, point-to-point calls and DDP's gradient buckets.

Traffic seen
------------
* the functions of ``torch.distributed`` (:data:`COLLECTIVES`), incl. the
  ``*_single`` ones FSDP2 (``fully_shard``) calls, and ``batch_isend_irecv``;
* DDP: its C++ reducer does not call them; :meth:`CollectiveHooks.register_ddp_comm_hook`
  installs a communication hook that times every gradient bucket (it wraps
  the default all-reduce, or the hook you pass);
* Megatron-style pipelines: point-to-point calls issued through
  ``torch.distributed`` (send/recv, isend/irecv, ``batch_isend_irecv``) are
  timed as *wait* (kind ``pp``) with no marking.

Process group names: ``world`` for the default group; a group registered with
:meth:`CollectiveHooks.name_group` (e.g. ``"tp:1"``) has that name; any other
is named by its ranks (``"ranks:0,1"``). The kind of a group is its name's
part before the colon.

:class:`CollectiveHooks` is a part of
:class:`~vigil.producers.training.monitor.TrainingMonitor` (its state lives there).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

from vigil.producers.training.timing import BLOCKED, COLLECTIVE, WAIT

if TYPE_CHECKING:
    from vigil.producers.training.monitor import TrainingMonitor

__all__ = ["COLLECTIVES", "P2P_KIND", "CollectiveHooks"]


#: torch.distributed function -> recorded op. Async variants are the same functions with
#: ``async_op=True`` (and isend/irecv), whose handle's ``wait()`` is timed too.
COLLECTIVES: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",  # FSDP2 (torch >= 2.10)
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",  # FSDP2
    "broadcast": "broadcast",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "send": "send",
    "recv": "recv",
    "isend": "send",
    "irecv": "recv",
    "barrier": "barrier",
    "reduce": "other",
    "gather": "other",
    "scatter": "other",
}


_ASYNC_ALWAYS = {"isend", "irecv"}


#: Point-to-point functions: their blocking time is *wait* (for a peer), not communication.
_P2P = {"send", "recv", "isend", "irecv"}


#: The group kind under which point-to-point time is reported.
P2P_KIND = "pp"


def _nbytes(x: Any) -> int:
    n = getattr(x, "nbytes", None)
    if isinstance(n, int):
        return n
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


class _TimedWork:
    """Proxy of an async operation's handle: ``wait()`` is timed (blocked on a collective, or waiting for a peer)."""

    __slots__ = ("_work", "_mon", "_rec", "_iv", "_p2p")

    def __init__(self, work: Any, mon: "TrainingMonitor", rec: list, iv: list | None, p2p: bool) -> None:
        self._work = work
        self._mon = mon
        self._rec = rec
        self._iv = iv
        self._p2p = p2p

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        mon = self._mon
        clock = mon._clock
        t0 = clock()
        s0 = mon._events.record() if mon._cuda else t0
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            t1 = clock()
            s1 = mon._events.record() if mon._cuda else t1
            if self._p2p:
                mon._iv.append([WAIT | BLOCKED, s0, s1, P2P_KIND])
                self._rec[5] = t1
            else:
                mon._iv.append([BLOCKED, s0, s1, None])
                iv = self._iv
                if iv is not None and iv[2] is None:  # no completion callback (yet): it ended by now
                    iv[2] = s1
                    self._rec[5] = t1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class _P2PWrapper:
    """``isend``/``irecv`` wrapped, still equal to the original: ``P2POp`` checks ``op in [isend, irecv]``."""

    def __init__(self, fn: Callable, wrapper: Callable) -> None:
        self._fn = fn
        self._wrapper = wrapper
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapper(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return other is self or other is self._fn

    def __hash__(self) -> int:
        return hash(self._fn)


# Position of the ``group`` parameter in each function's signature.
_GROUP_POS = {"all_reduce": 2, "all_gather": 2, "all_gather_into_tensor": 2, "all_gather_single": 2,
              "reduce_scatter": 3, "reduce_scatter_tensor": 3, "reduce_scatter_single": 3, "broadcast": 2,
              "all_to_all": 2, "all_to_all_single": 4, "send": 2, "recv": 2, "isend": 2, "irecv": 2, "reduce": 3,
              "gather": 3, "scatter": 3}


# Position of ``async_op`` (when passed positionally).
_ASYNC_POS = {"all_reduce": 3, "all_gather": 3, "all_gather_into_tensor": 3, "all_gather_single": 3,
              "reduce_scatter": 4, "reduce_scatter_tensor": 4, "reduce_scatter_single": 4, "broadcast": 3,
              "all_to_all": 3, "all_to_all_single": 5, "barrier": 1, "reduce": 4, "gather": 4, "scatter": 4}


def _positional_group(name: str, args: tuple) -> Any:
    pos = _GROUP_POS.get(name)
    return args[pos] if pos is not None and len(args) > pos else None


class CollectiveHooks:
    """The monitor's torch.distributed instrumentation (see the module docstring)."""

    def name_group(self, group: Any, name: str) -> None:
        """Name a process group in the records (e.g. ``"tp:0"``: the kind before the colon)."""
        self._group_names[id(group)] = name

    def _group_name(self, group: Any) -> str:
        if group is None:
            return "world"
        name = self._group_names.get(id(group))
        if name is None:
            try:
                ranks = self._dist.get_process_group_ranks(group)
                name = "world" if len(ranks) == self._dist.get_world_size() else "ranks:" + ",".join(map(str, ranks))
            except Exception:
                name = f"group:{id(group):x}"
            self._group_names[id(group)] = name
        return name

    def instrument_collectives(self, dist: Any = None, saves: bool = True) -> None:
        """Wrap the collectives of ``torch.distributed`` (call after ``init_process_group``).

        With ``timing="auto"`` this is where the path is chosen: CUDA events
        when the default group's backend is NCCL, the host clock otherwise.
        ``saves``: also mark the loop's ``torch.save`` and DCP saves as
        checkpoints (:mod:`vigil.producers.training.saves`), when ``dist`` is
        torch's own (a stand-in given for tests leaves torch alone).
        """
        if saves and (dist is None or getattr(dist, "__name__", None) == "torch.distributed"):
            self.instrument_saves()  # type: ignore[attr-defined]
        if self._originals:
            return
        if dist is None:
            import torch.distributed as dist  # noqa: PLC0415 - torch is optional for the rest
        self._dist = dist
        if self.timing == "auto" and not self._cuda:
            try:
                backend = str(dist.get_backend()).lower()
            except Exception:
                backend = ""
            if "nccl" in backend:
                self._use_cuda()
        for name, op in COLLECTIVES.items():
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            self._originals[name] = fn
            w = self._wrap(fn, name, op)
            setattr(dist, name, _P2PWrapper(fn, w) if name in _ASYNC_ALWAYS else w)
        batch = getattr(dist, "batch_isend_irecv", None)
        if batch is not None:
            self._originals["batch_isend_irecv"] = batch
            setattr(dist, "batch_isend_irecv", self._wrap_batch(batch))

    def uninstrument_collectives(self) -> None:
        """Undo :meth:`instrument_collectives` (the save wrappers too)."""
        for name, fn in self._originals.items():
            setattr(self._dist, name, fn)
        self._originals = {}
        self.uninstrument_saves()  # type: ignore[attr-defined]

    def _wrap(self, fn: Callable, name: str, op: str) -> Callable:
        mon = self
        always_async = name in _ASYNC_ALWAYS
        p2p = name in _P2P
        async_pos = _ASYNC_POS.get(name)
        tls = self._tls

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if getattr(tls, "depth", 0):
                return fn(*args, **kwargs)  # inside a call timed as a whole (a DDP hook, a batch of P2P ops)
            clock = mon._clock
            cuda = mon._cuda
            t0 = clock()
            s0 = mon._events.record() if cuda else t0
            result = fn(*args, **kwargs)
            t1 = clock()
            group = kwargs.get("group")
            if group is None and name != "barrier":
                group = _positional_group(name, args)
            elif name == "barrier" and group is None and args:
                group = args[0]
            gname = mon._group_name(group)
            rec = ["cc", op, gname, _nbytes(args[0]) if args and name != "barrier" else 0, t0, t1]
            is_async = always_async or bool(kwargs.get("async_op")) or (
                async_pos is not None and len(args) > async_pos and bool(args[async_pos]))
            if getattr(tls, "marked", 0):  # inside pipeline_wait(): the call is recorded, its time is the block's
                mon._append(rec)
                return result
            if not is_async or result is None:
                s1 = mon._events.record() if cuda else t1
                if p2p:
                    mon._iv.append([WAIT | BLOCKED, s0, s1, P2P_KIND])
                else:
                    mon._iv.append([COLLECTIVE | BLOCKED, s0, s1, gname.split(":", 1)[0]])
                mon._append(rec)
                return result
            mon._append(rec)
            if p2p:
                return _TimedWork(result, mon, rec, None, True)
            iv = [COLLECTIVE, s0, None, gname.split(":", 1)[0]]
            mon._iv.append(iv)
            mon._on_completion(result, iv, rec)
            return _TimedWork(result, mon, rec, iv, False)

        return wrapper

    def _on_completion(self, work: Any, iv: list[Any], rec: list[Any]) -> None:
        """End an async collective's interval when it completes: a callback on its future.

        CPU (gloo): the callback runs on the backend's thread when the work
        completes; the host clock then is its end. CUDA: the callback runs with
        the current stream synchronised with the collective's stream, so an
        event recorded there completes when the collective does.
        """
        try:
            fut = work.get_future()
        except Exception:  # no futures on this backend: the end is when wait() returns
            return
        mon = self
        if self._cuda:
            def done(f: Any) -> None:
                iv[2] = mon._events.record()
        else:
            def done(f: Any) -> None:
                t = mon._clock()
                iv[2] = t
                rec[5] = t
        fut.then(done)

    def _wrap_batch(self, fn: Callable) -> Callable:
        """``batch_isend_irecv``: one wait per returned request; the isend/irecv inside are not timed again."""
        mon = self
        tls = self._tls
        originals = self._originals

        @functools.wraps(fn)
        def wrapper(p2p_op_list: list) -> Any:
            if getattr(tls, "depth", 0):
                return fn(p2p_op_list)
            for p in p2p_op_list:  # torch tells send from recv by identity (`op.op is isend`)
                o = getattr(p, "op", None)
                if isinstance(o, _P2PWrapper):
                    p.op = o._fn
            t0 = mon._clock()
            tls.depth = getattr(tls, "depth", 0) + 1
            try:
                works = fn(p2p_op_list)
            finally:
                tls.depth -= 1
            t1 = mon._clock()
            out = []
            for p, w in zip(p2p_op_list, works or []):
                op = "send" if getattr(p, "op", None) is originals.get("isend") or getattr(getattr(p, "op", None), "__name__", "") == "isend" else "recv"
                rec = ["cc", op, mon._group_name(getattr(p, "group", None)), _nbytes(getattr(p, "tensor", None)), t0, t1]
                mon._append(rec)
                out.append(w if getattr(tls, "marked", 0) else _TimedWork(w, mon, rec, None, True))
            return out if works is not None else works

        return wrapper

    def register_ddp_comm_hook(self, model: Any, hook: Callable | None = None, state: Any = None,
                               group_name: str | None = None) -> None:
        """Install on a ``DistributedDataParallel`` model a communication hook that times every gradient bucket.

        One call instead of ``model.register_comm_hook(state, hook)``: with no
        ``hook`` it wraps torch's default all-reduce (``allreduce_hook``, with
        ``state`` the process group, default DDP's); otherwise it wraps yours
        with your ``state``. DDP accepts one hook per model: if one is already
        registered, pass it here instead.

        Each bucket is a collective from the hook's call to its future's
        completion (kind ``dp`` unless the group was named with
        :meth:`name_group`); the rank is *blocked* from the last bucket's call
        (the end of the backward's compute) until every bucket of that
        backward has completed (DDP waits for them there).
        """
        if getattr(model, "_comm_hooks", None):
            raise RuntimeError("this DDP model already has a communication hook; DDP accepts one: pass it as "
                               "register_ddp_comm_hook(model, hook=your_hook, state=your_state)")
        if hook is None:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook as hook  # noqa: PLC0415
        default = getattr(hook, "__name__", "") == "allreduce_hook"
        group = state if default and state is not None else getattr(model, "process_group", None)
        if group_name is None:
            group_name = self._group_names.get(id(group)) if group is not None else None
        gname = group_name or "dp"
        kind = gname.split(":", 1)[0]
        mon = self
        tls = self._tls
        batch: list[list[Any]] = []

        def timed_hook(st, bucket):  # type: ignore[no-untyped-def]  # DDP checks the annotations: none here
            cuda = mon._cuda
            t0 = mon._clock()
            s0 = mon._events.record() if cuda else t0
            tls.depth = getattr(tls, "depth", 0) + 1
            try:
                fut = hook(st, bucket)
            finally:
                tls.depth -= 1
            buf = bucket.buffer()
            rec = ["cc", "all_reduce", gname, int(buf.numel() * buf.element_size()), t0, t0]
            iv = [COLLECTIVE, s0, None, kind]
            mon._iv.append(iv)
            batch.append(iv)
            if bucket.is_last():
                mon._iv.append([BLOCKED, s0, None, None, list(batch)])
                batch.clear()

            def done(f: Any) -> Any:
                if cuda:
                    iv[2] = mon._events.record()
                else:
                    t = mon._clock()
                    iv[2] = t
                    rec[5] = t
                return f.value()

            mon._append(rec)
            return fut.then(done)

        model.register_comm_hook(state, timed_hook)
