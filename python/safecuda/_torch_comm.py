"""safecuda.torch.Comm: a safecuda communicator whose collectives take torch CUDA tensors,
made from a torch.distributed process group (imported by safecuda.torch).

    dist.init_process_group("gloo")               # or "nccl"; one process per GPU
    torch.cuda.set_device(local_rank)
    comm = safecuda.torch.Comm.from_process_group()
    comm.all_reduce(x)                            # in place, on torch's current stream
    comm.all_to_all_v(out, x, out_splits, in_splits)

The tensors are borrowed as safecuda buffers for the call (no copy) and the collective is
enqueued on torch's current stream of the communicator's device, so torch's later work on
that stream is ordered after it, as with torch.distributed's own collectives.
"""

import threading
from ctypes import byref, c_uint64

import torch

from . import _lib
from ._comm import Comm as _Comm
from ._comm import _counts, _op
from ._core import default_context
from ._dtype import as_dtype
from ._lib import fail, intern_c_string, lib, sc_borrow_desc, sc_view

_SITE_FILE = intern_c_string(__file__)


def _current_stream_handle(index):
    return torch.cuda.current_stream(index).cuda_stream


_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _current_stream_handle)
_groups = threading.local()  # .depth, .handles: borrowed buffers kept to the group's end


class Comm:
    """One rank of a safecuda communicator on a CUDA device, for torch tensors. Make it with
    Comm.from_process_group(pg), or Comm(safecuda_comm) over a safecuda.Comm. Tensors must
    be contiguous CUDA tensors on the communicator's device; the collectives follow
    torch.distributed's argument order (output first)."""

    def __init__(self, comm):
        if not isinstance(comm, _Comm):
            raise TypeError(f"safecuda.torch.Comm wraps a safecuda.Comm, not "
                            f"{type(comm).__name__} (from_process_group makes one)")
        self.comm = comm
        self._ctx = comm.context
        self.device = torch.device("cuda", self._ctx.device)

    @classmethod
    def from_process_group(cls, pg=None, *, device=None, timeout_ms=0, label=None):
        """This process's rank of a communicator over the ranks of a torch.distributed
        process group (default: the world). Rank 0 of the group makes the unique id and
        broadcasts it through the group (a uint8 tensor on its backend: CPU for gloo, the
        device for nccl); every rank of the group must call this together. device: this
        rank's GPU (default: torch.cuda.current_device()); its communicator lives on the
        package's default context of that device."""
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("safecuda.torch.Comm.from_process_group: torch.distributed "
                               "is not initialized (call dist.init_process_group first)")
        group = pg if pg is not None else dist.group.WORLD
        rank, nranks = dist.get_rank(group), dist.get_world_size(group)
        if rank < 0:
            raise ValueError("safecuda.torch.Comm.from_process_group: this process is not a "
                             "member of the process group")
        if device is None:
            index = torch.cuda.current_device()
        else:
            dev = torch.device("cuda", device) if isinstance(device, int) else \
                torch.device(device)
            if dev.type != "cuda":
                raise ValueError(f"safecuda.torch.Comm.from_process_group: device {dev} is "
                                 f"not a CUDA device")
            index = dev.index if dev.index is not None else torch.cuda.current_device()
        backend = str(dist.get_backend(group)).lower()
        where = torch.device("cpu") if "gloo" in backend or "nccl" not in backend else \
            torch.device("cuda", index)
        ids = torch.zeros(_lib.SC_COMM_ID_BYTES, dtype=torch.uint8, device=where)
        if rank == 0:
            ids.copy_(torch.tensor(list(_Comm.unique_id()), dtype=torch.uint8))
        get_global = getattr(dist, "get_global_rank", None) or \
            dist.distributed_c10d._get_global_rank
        dist.broadcast(ids, src=get_global(group, 0), group=group)
        uid = bytes(ids.cpu().tolist())
        comm = _Comm(default_context(index), uid, nranks, rank, timeout_ms=timeout_ms,
                     label=label if label is not None else "process group")
        return cls(comm)

    # ---- the communicator -----------------------------------------------------------

    @property
    def rank(self):
        return self.comm.rank

    @property
    def nranks(self):
        return self.comm.nranks

    def __repr__(self):
        return f"<safecuda.torch.Comm rank {self.rank} of {self.nranks} on {self.device}>"

    def close(self):
        self.comm.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def abort(self):
        self.comm.abort()

    def info(self):
        return self.comm.info()

    def synchronize(self):
        self.comm.synchronize()

    def query(self):
        return self.comm.query()

    @staticmethod
    def group():
        """As safecuda.Comm.group(), keeping the tensors borrowed inside it until it ends
        (use this one, not safecuda.Comm.group(), around this class's calls)."""
        return _TorchGroup()

    # ---- plumbing -------------------------------------------------------------------

    def _check(self, fn, name, t):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"safecuda.torch.Comm.{fn}: {name} is {type(t).__name__}, not a "
                            f"torch tensor")
        if t.device != self.device:
            raise ValueError(f"safecuda.torch.Comm.{fn}: {name} is on {t.device}; the "
                             f"communicator is on {self.device}")
        if not t.is_contiguous():
            raise ValueError(f"safecuda.torch.Comm.{fn}: {name} is not contiguous (call "
                             f".contiguous())")
        try:
            return as_dtype(t.dtype)
        except (ValueError, TypeError):
            raise TypeError(f"safecuda.torch.Comm.{fn}: {name} is {t.dtype}, which safecuda "
                            f"has no element type for") from None

    def _stream(self):
        cu = _current_raw_stream(self.device.index)
        st = self._ctx._wrapped.get(cu)
        if st is None:
            st = self._ctx.wrap_stream(cu)
        return st._h

    def _borrow(self, t, dtype, read_only, stream, handles, keep):
        count = t.numel()
        if count == 0:  # a view of no elements (of a scratch element: none are touched)
            t = torch.empty(1, dtype=t.dtype, device=t.device)
            keep.append(t)
        d = sc_borrow_desc(int(dtype), max(count, 1), None, stream, read_only)
        h = c_uint64()
        r = lib.sc_buffer_borrow_at(self._ctx._h, t.data_ptr(), byref(d), byref(h),
                                    _SITE_FILE, 1)
        if r:
            fail(r)
        handles.append(h.value)
        return sc_view(h.value, 0, count)

    def _run(self, fn, call, tensors):
        """call(stream, *views) with each (tensor, read_only) borrowed for the call (kept to
        the end of the enclosing group)."""
        handles, keep = [], []
        try:
            sh = self._stream()
            views = [self._borrow(t, dt, ro, sh, handles, keep) for t, dt, ro in tensors]
            r = call(sh, *views)
            if r:
                fail(r)
        finally:
            if getattr(_groups, "depth", 0) > 0:
                _groups.handles.extend(handles)
                _groups.keep.extend(keep)
            else:
                for h in handles:  # forgotten once safecuda's work is ordered
                    lib.sc_buffer_destroy(h)

    def _pair(self, fn, output, input):
        do = self._check(fn, "output", output)
        di = self._check(fn, "input", input)
        if do != di:
            raise TypeError(f"safecuda.torch.Comm.{fn}: output is {output.dtype} but input "
                            f"is {input.dtype}")
        return do

    # ---- collectives (on torch's current stream of the device) ----------------------

    def all_reduce(self, tensor, op="sum"):
        """tensor = op over the ranks of tensor, in place; returns tensor."""
        o = _op("all_reduce", op)
        d = self._check("all_reduce", "tensor", tensor)
        self._run("all_reduce", lambda s, v: lib.sc_comm_all_reduce(self.comm._h, s, v, v, o),
                  [(tensor, d, False)])
        return tensor

    def reduce_scatter(self, output, input, op="sum"):
        """output (n elements) = part `rank` of the reduction over the ranks of input
        (nranks x n elements); returns output."""
        o = _op("reduce_scatter", op)
        d = self._pair("reduce_scatter", output, input)
        self._run("reduce_scatter",
                  lambda s, vo, vi: lib.sc_comm_reduce_scatter(self.comm._h, s, vo, vi, o),
                  [(output, d, False), (input, d, True)])
        return output

    def all_gather(self, output, input):
        """output (nranks x n elements) = every rank's input (n), rank r's at part r."""
        d = self._pair("all_gather", output, input)
        self._run("all_gather",
                  lambda s, vo, vi: lib.sc_comm_all_gather(self.comm._h, s, vo, vi),
                  [(output, d, False), (input, d, True)])
        return output

    def all_to_all(self, output, input):
        """input's part p (of nranks equal parts) goes to rank p; output's part p comes from
        rank p (torch.distributed.all_to_all_single without split sizes)."""
        d = self._pair("all_to_all", output, input)
        self._run("all_to_all",
                  lambda s, vo, vi: lib.sc_comm_all_to_all(self.comm._h, s, vo, vi),
                  [(output, d, False), (input, d, True)])
        return output

    def all_to_all_v(self, output, input, output_split_sizes, input_split_sizes):
        """torch.distributed.all_to_all_single with split sizes: input_split_sizes[p] rows
        (along dim 0) of input go to rank p, packed in rank order; output_split_sizes[p]
        rows from rank p land in output, packed in rank order."""
        fn, n = "all_to_all_v", self.nranks
        d = self._pair(fn, output, input)
        rows_o = output.numel() // output.shape[0] if output.dim() and output.shape[0] else 1
        rows_i = input.numel() // input.shape[0] if input.dim() and input.shape[0] else 1
        rc = _counts(fn, "output_split_sizes", output_split_sizes, n)
        sc = _counts(fn, "input_split_sizes", input_split_sizes, n)
        if output.dim() and input.dim() and rows_o != rows_i:
            raise ValueError(f"safecuda.torch.Comm.{fn}: output rows have {rows_o} elements, "
                             f"input rows {rows_i}")
        for i in range(n):
            rc[i] *= rows_o
            sc[i] *= rows_i
        self._run(fn, lambda s, vo, vi: lib.sc_comm_all_to_all_v(self.comm._h, s, vo, rc, None,
                                                                 vi, sc, None),
                  [(output, d, False), (input, d, True)])
        return output

    def send(self, tensor, peer):
        d = self._check("send", "tensor", tensor)
        p = int(peer)
        self._run("send", lambda s, v: lib.sc_comm_send(self.comm._h, s, v, p),
                  [(tensor, d, True)])

    def recv(self, tensor, peer):
        d = self._check("recv", "tensor", tensor)
        p = int(peer)
        self._run("recv", lambda s, v: lib.sc_comm_recv(self.comm._h, s, v, p),
                  [(tensor, d, False)])
        return tensor


class _TorchGroup:
    def __enter__(self):
        r = lib.sc_comm_group_begin()
        if r:
            fail(r)
        if getattr(_groups, "depth", 0) == 0:
            _groups.handles, _groups.keep = [], []
        _groups.depth = getattr(_groups, "depth", 0) + 1
        return self

    def __exit__(self, exc_type, *_):
        _groups.depth -= 1
        r = lib.sc_comm_group_end()
        if _groups.depth == 0:
            for h in _groups.handles:
                lib.sc_buffer_destroy(h)
            _groups.handles, _groups.keep = [], []
        if r and exc_type is None:
            fail(r)
        return False
