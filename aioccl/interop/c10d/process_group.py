"""``AiocclProcessGroup``: every c10d op of ``torch.distributed`` on an aioccl communicator.

torch 2.13 lets Python subclass ``ProcessGroup`` (not the C++ ``Backend``):
``dist.*`` calls these methods from Python, and C++ callers (DDP's reducer,
functional collectives) reach them through torch's trampoline. Each starts
aioccl ops at once and returns a ``TorchWork``; tensors are viewed in place
(``aioccl.tensors``), so an in-place op writes the caller's tensor.
Where torch passes a list of tensors that aioccl wants as one array (the
output list of ``all_gather``, the input list of ``reduce_scatter``), the
list goes through one flat tensor and a copy.

Method names are torch's (``allreduce``, ``alltoall_base`` ...), camelCase
where its C++ virtuals are (``getBackendName``).
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import torch
import torch._C._distributed_c10d as _c10d  # AllgatherOptions: not re-exported by torch.distributed
import torch.distributed as dist

from ... import lowlevel
from ...communicator import Communicator
from ...errors import InvalidArgument
from ...p2p import ANY_SOURCE
from ...work import Work
from . import DEVICES
from .monitored import monitored_barrier, seconds
from .sparse import sparse_allreduce
from .work import TorchWork, as_aioccl

_REDUCTIONS = {dist.ReduceOp.RedOpType.SUM.value: "sum", dist.ReduceOp.RedOpType.PRODUCT.value: "prod",
               dist.ReduceOp.RedOpType.MIN.value: "min", dist.ReduceOp.RedOpType.MAX.value: "max",
               dist.ReduceOp.RedOpType.AVG.value: "avg"}  # by the enum's value: hashing the enum costs a microsecond
_SUM = dist.ReduceOp.SUM
_UNSET = timedelta(0)  # torch's "no timeout of its own" is negative (kUnsetTimeout, -1 ms)


class AiocclProcessGroup(dist.ProcessGroup):
    """A torch process group whose ops run on ``comm`` (rank ``rank`` of ``size``)."""

    def __init__(self, comm: Communicator, rank: int, size: int, timeout: float) -> None:
        super().__init__(rank, size)
        self.comm = comm
        self._timeout = timeout
        # what an op of this group passes as its timeout: None where the communicator's own default is the same
        self._op_timeout = None if timeout == lowlevel.default_timeout(comm) else timeout
        self._group_name = ""
        self._group_desc = ""
        self._exchange: Communicator | None = None  # uneven all-to-alls: sends and receives of their own
        self._exchanges = itertools.count()
        self._coalesced: list[TorchWork] | None = None
        self._monitored = 0  # monitored barriers so far (their tags)
        self._engine_thread = lowlevel.engine_thread(comm)

    # -- identity ----------------------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802  (torch's C++ name)
        return "aioccl"

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def __repr__(self) -> str:
        return f"<AiocclProcessGroup rank {self.rank()} of {self.size()} over {self.comm!r}>"

    # -- what torch asks of a backend -----------------------------------------------------------------------
    @property
    def _device_types(self) -> list[torch.device]:
        """The devices this group serves (torch's ``_get_pg_default_device``, object collectives)."""
        return [torch.device(d) for d in DEVICES]

    def _get_backend(self, device: Any) -> AiocclProcessGroup:
        """The backend for ``device``: this group itself, for each device it registered (torch's own Python
        process groups cannot have a C++ ``Backend`` behind them: its constructor is not exposed)."""
        kind = torch.device(device).type
        if kind not in DEVICES:
            raise RuntimeError(f"No backend type associated with device type {kind} (aioccl serves {DEVICES})")
        return self

    def _get_sequence_number_for_group(self) -> int:
        """How many collectives this group has issued (aioccl numbers every one; its errors name the number)."""
        return lowlevel.next_seq(self.comm)

    def _set_sequence_number_for_group(self) -> None:
        """Sequence numbers are always on."""

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """Gloo's monitored barrier (see ``monitored.py``): rank 0 names the ranks that did not arrive."""
        call, self._monitored = self._monitored, self._monitored + 1
        monitored_barrier(self.comm, call, seconds(timeout, self._timeout), wait_all_ranks)

    # -- helpers -------------------------------------------------------------------------------------------
    def _deadline(self, opts: Any) -> float:
        t = getattr(opts, "timeout", None)
        seconds = t.total_seconds() if t is not None else 0.0
        return seconds if seconds > 0 else self._timeout

    @staticmethod
    def _reduction(opts: Any) -> str:
        kind = opts.reduceOp
        kind = getattr(kind, "op", kind)
        name = _REDUCTIONS.get(getattr(kind, "value", kind))
        if name is None:
            raise InvalidArgument(f"aioccl reduces with sum, product, min, max and avg; not {kind}")
        return name

    @staticmethod
    def _single(tensors: list[torch.Tensor], what: str) -> torch.Tensor:
        if len(tensors) != 1:
            raise InvalidArgument(f"{what}: aioccl takes one tensor per rank, got {len(tensors)}")
        return tensors[0]

    @staticmethod
    def _flat(t: torch.Tensor, what: str) -> torch.Tensor:
        """``t`` as one dimension, sharing its memory (a copy would lose the results)."""
        if t.layout != torch.strided:
            raise InvalidArgument(f"{what}: tensors of layout {t.layout} are not supported (dense torch.strided "
                                  f"tensors only)")
        if not t.is_contiguous():
            raise InvalidArgument(f"{what}: tensors must be contiguous (strides {t.stride()})")
        return t.reshape(-1)

    def _work(self, works: list[Work[Any]], result: list[torch.Tensor], what: str, finish: Any = None,
              source: Work[Any] | None = None) -> TorchWork:
        w = TorchWork(works, result, what, finish, self._engine_thread, source)
        if self._coalesced is not None:
            self._coalesced.append(w)
        return w

    # -- reductions and broadcasts -----------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        """The call ``dist.all_reduce`` makes (one dense tensor, SUM, no timeout of its own) checks only that
        before it starts, since its Python costs more than a small op itself (docs/benchmarks.md, "torch's
        all_reduce"); every other call takes ``_allreduce``."""
        if opts is not None and len(tensors) == 1 and opts.reduceOp == _SUM and opts.timeout < _UNSET:
            t = tensors[0]
            if t.layout is torch.strided:
                w = TorchWork([self.comm.all_reduce(t, "sum", timeout=self._op_timeout)], tensors, "allreduce",
                              None, self._engine_thread)
                if self._coalesced is not None:
                    self._coalesced.append(w)
                return w
        return self._allreduce(tensors, opts)

    def _allreduce(self, tensors: list[torch.Tensor], opts: Any) -> TorchWork:
        opts = opts or dist.AllreduceOptions()
        t = tensors[0] if len(tensors) == 1 else self._single(tensors, "allreduce")
        if t.layout == torch.sparse_coo:
            if self._reduction(opts) != "sum":
                raise InvalidArgument("allreduce of a sparse tensor: only SUM is supported (as with Gloo)")
            works, finish = sparse_allreduce(self.comm, t, self._deadline(opts))
            return self._work(works, [t], "allreduce (sparse)", finish)
        deadline = self._deadline(opts)  # the communicator's own default needs no checking again (None)
        timeout = self._op_timeout if deadline == self._timeout else deadline
        return self._work([self.comm.all_reduce(t, self._reduction(opts), timeout=timeout)], tensors, "allreduce")

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        opts = opts or dist.AllreduceCoalescedOptions()
        op, t = self._reduction(opts), self._deadline(opts)
        return self._work([self.comm.all_reduce(x, op, timeout=t) for x in tensors], tensors, "allreduce_coalesced")

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        opts = opts or dist.BroadcastOptions()
        t = self._single(tensors, "broadcast")
        return self._work([self.comm.broadcast(t, root=opts.rootRank, timeout=self._deadline(opts))], tensors,
                          "broadcast")

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> TorchWork:
        opts = opts or dist.ReduceOptions()
        t = self._single(tensors, "reduce")
        w = self.comm.reduce(t, root=opts.rootRank, op=self._reduction(opts), timeout=self._deadline(opts))
        return self._work([w], tensors, "reduce")

    # -- gathers ---------------------------------------------------------------------------------------------
    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TorchWork:
        opts = opts or _c10d.AllgatherOptions()
        return self._work([self._gather_into(output, input, self._deadline(opts))], [output],
                          "all_gather_into_tensor")

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> TorchWork:
        t = self._deadline(opts or _c10d.AllgatherOptions())
        works = [self._gather_into(o, i, t) for o, i in zip(outputs, inputs, strict=True)]
        return self._work(works, outputs, "all_gather_into_tensor_coalesced")

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _gather_into(self, output: torch.Tensor, input: torch.Tensor, timeout: float) -> Work[Any]:
        return self.comm.all_gather(self._flat(input, "all_gather_into_tensor"),
                                    out=self._flat(output, "all_gather_into_tensor"), timeout=timeout)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> TorchWork:
        opts = opts or _c10d.AllgatherOptions()
        outs = output_tensors[0]
        w, flat = self._gather_list(outs, self._single(input_tensors, "allgather"), self._deadline(opts))
        return self._work([w], outs, "allgather", lambda: _unflatten(flat, outs))

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> TorchWork:
        """``output_lists[r][i]`` receives rank r's ``inputs[i]``: rank-major, as torch and Gloo lay it out
        (checked against Gloo on the same inputs: tests/workers/torch_c10d.py)."""
        t = self._deadline(opts or _c10d.AllgatherOptions())
        if len(output_lists) != self.size() or any(len(outs) != len(inputs) for outs in output_lists):
            raise ValueError(f"allgather_coalesced: output_tensor_lists must hold one list per rank ({self.size()}),"
                             f" each of one tensor per input ({len(inputs)}); got lists of "
                             f"{[len(outs) for outs in output_lists]}")
        per_input = [[outs[i] for outs in output_lists] for i in range(len(inputs))]
        started = [self._gather_list(o, i, t) for o, i in zip(per_input, inputs, strict=True)]

        def finish() -> None:
            for (_w, flat), outs in zip(started, per_input, strict=True):
                _unflatten(flat, outs)

        return self._work([w for w, _ in started], [t for o in output_lists for t in o], "allgather_coalesced",
                          finish)

    def _gather_list(self, outs: list[torch.Tensor], inp: torch.Tensor,
                     timeout: float) -> tuple[Work[Any], torch.Tensor]:
        """All-gather ``inp`` into one flat tensor, which ``_unflatten`` copies into ``outs`` once done."""
        flat = torch.empty(len(outs) * inp.numel(), dtype=inp.dtype, device=inp.device)
        return self.comm.all_gather(self._flat(inp, "allgather"), out=flat, timeout=timeout), flat

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> TorchWork:
        opts = opts or dist.GatherOptions()
        inp = self._single(input_tensors, "gather")
        root, t = opts.rootRank, self._deadline(opts)
        if self.rank() != root:
            return self._work([self.comm.gather(self._flat(inp, "gather"), root, timeout=t)], [], "gather")
        outs = output_tensors[0]
        flat = torch.empty(len(outs) * inp.numel(), dtype=inp.dtype, device=inp.device)
        w = self.comm.gather(self._flat(inp, "gather"), root, out=flat, timeout=t)
        return self._work([w], outs, "gather", lambda: _unflatten(flat, outs))

    # -- scatters --------------------------------------------------------------------------------------------
    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> TorchWork:
        opts = opts or dist.ScatterOptions()
        out = self._single(output_tensors, "scatter")
        root, t = opts.rootRank, self._deadline(opts)
        whole = torch.cat([x.reshape(-1) for x in input_tensors[0]]) if self.rank() == root else None
        w = self.comm.scatter(whole, root, out=self._flat(out, "scatter"), timeout=t)
        return self._work([w], output_tensors, "scatter")

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = None) -> TorchWork:
        opts = opts or dist.ReduceScatterOptions()
        out = self._single(output_tensors, "reduce_scatter")
        whole = torch.cat([x.reshape(-1) for x in input_tensors[0]])
        w = self.comm.reduce_scatter(whole, self._reduction(opts), out=self._flat(out, "reduce_scatter"),
                                     timeout=self._deadline(opts))
        return self._work([w], output_tensors, "reduce_scatter")

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> TorchWork:
        return self.reduce_scatter_single_coalesced([output], [input], opts, "reduce_scatter_tensor")

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None, what: str = "reduce_scatter_tensor_coalesced") -> TorchWork:
        opts = opts or dist.ReduceScatterOptions()
        op, t = self._reduction(opts), self._deadline(opts)
        works = [self.comm.reduce_scatter(self._flat(i, what), op, out=self._flat(o, what), timeout=t)
                 for o, i in zip(outputs, inputs, strict=True)]
        return self._work(works, outputs, what)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- all to all ------------------------------------------------------------------------------------------
    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> TorchWork:
        opts = opts or dist.AllToAllOptions()
        n, t = self.size(), self._deadline(opts)
        src, dst = self._flat(input, "all_to_all_single"), self._flat(output, "all_to_all_single")
        if not output_split_sizes and not input_split_sizes:
            return self._work([self.comm.all_to_all(src, out=dst, timeout=t)], [output], "all_to_all_single")
        row_in = input[0].numel() if input.dim() else 1
        row_out = output[0].numel() if output.dim() else 1
        ins = _pieces(src, [s * row_in for s in input_split_sizes] if input_split_sizes else None, n)
        outs = _pieces(dst, [s * row_out for s in output_split_sizes] if output_split_sizes else None, n)
        return self._exchange_pieces(ins, outs, t, [output], "all_to_all_single")

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> TorchWork:
        opts = opts or dist.AllToAllOptions()
        ins = [self._flat(x, "all_to_all") for x in input_tensors]
        outs = [self._flat(x, "all_to_all") for x in output_tensors]
        return self._exchange_pieces(ins, outs, self._deadline(opts), output_tensors, "all_to_all")

    def _exchange_pieces(self, ins: list[torch.Tensor], outs: list[torch.Tensor], timeout: float,
                         result: list[torch.Tensor], what: str) -> TorchWork:
        """Piece j of ``ins`` to rank j, piece j of ``outs`` from it (any sizes): sends and receives on a
        group of their own, so they never match the user's point-to-point messages."""
        me = self.rank()
        if len(ins) != self.size() or len(outs) != self.size():
            raise InvalidArgument(f"{what}: {len(ins)} inputs and {len(outs)} outputs for {self.size()} ranks")
        if self._exchange is None:
            self._exchange = self.comm.create_group(list(range(self.size())), tag="c10d-all-to-all",
                                                    timeout=timeout).wait()
        tag = next(self._exchanges)
        works: list[Work[Any]] = []
        for j in range(self.size()):
            if j == me:
                continue
            if outs[j].numel():
                works.append(self._exchange.irecv(outs[j], j, tag, timeout=timeout))
            if ins[j].numel():
                works.append(self._exchange.isend(ins[j], j, tag, timeout=timeout))
        outs[me].copy_(ins[me])
        return self._work(works, result, what)

    # -- the rest --------------------------------------------------------------------------------------------
    def barrier(self, opts: Any = None) -> TorchWork:
        opts = opts or dist.BarrierOptions()
        return self._work([self.comm.barrier(timeout=self._deadline(opts))], [], "barrier")

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> TorchWork:
        t = self._single(tensors, "send")
        return self._work([self.comm.isend(t, dst, tag)], tensors, f"send(dst={dst}, tag={tag})")

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> TorchWork:
        t = self._single(tensors, "recv")
        w = self.comm.irecv(t, src, tag)
        return self._work([w], tensors, f"recv(src={src}, tag={tag})", source=w)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> TorchWork:
        """``dist.recv(t)`` without ``src``: the first message with ``tag`` from any rank; the Work's
        ``_source_rank()`` says whose (torch's ``recv`` returns it)."""
        t = self._single(tensors, "recv")
        w = self.comm.irecv(t, ANY_SOURCE, tag)
        return self._work([w], tensors, f"recv(src=any, tag={tag})", source=w)

    def start_coalescing(self, device: Any) -> None:
        """Ops until ``end_coalescing`` are started at once, as always, and waited for together."""
        self._coalesced = []

    def end_coalescing(self, device: Any) -> TorchWork:
        """One Work for the ops since ``start_coalescing``: done when all are (their ops, then copies)."""
        works, self._coalesced = self._coalesced or [], None
        return self._work([as_aioccl(w) for w in works], [t for w in works for t in w.result()], "coalesced ops")

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    def abort(self) -> None:
        self.comm.abort()

    def shutdown(self) -> None:
        self.comm.close().wait()


def _unflatten(flat: torch.Tensor, outs: list[torch.Tensor]) -> None:
    """Copy consecutive pieces of ``flat`` into ``outs`` (on the engine thread, once the op is done).

    CUDA tensors: the copies are kernels on this thread's stream, so the host waits for them before the
    Work completes: a completed Work's results are in place for every stream, as aioccl's GPU ops are."""
    at = 0
    for o in outs:
        o.copy_(flat[at:at + o.numel()].view(o.shape))
        at += o.numel()
    if flat.is_cuda:
        torch.cuda.current_stream(flat.device).synchronize()


def _pieces(flat: torch.Tensor, sizes: list[int] | None, n: int) -> list[torch.Tensor]:
    """``flat`` cut into ``sizes`` (elements), or into ``n`` equal pieces."""
    if sizes is None:
        if flat.numel() % n:
            raise InvalidArgument(f"all_to_all_single: {flat.numel()} elements do not split evenly over {n} ranks")
        sizes = [flat.numel() // n] * n
    if len(sizes) != n or sum(sizes) != flat.numel():
        raise InvalidArgument(f"all_to_all_single: split sizes {sizes} do not cover {flat.numel()} elements "
                              f"in {n} pieces")
    return list(torch.split(flat, sizes))

