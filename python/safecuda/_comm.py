"""Communicators: collectives between GPUs over NCCL (include/safecuda/comm.h).

    ids = sc.Comm.unique_id()                  # on rank 0; send the bytes to the others
    comm = sc.Comm(ctx, ids, nranks, rank)     # on every rank (returns once all joined)
    comm.all_reduce(x)                         # in place, sum, on the context's stream

    comms = sc.Comm.create_all([sc.Context(d) for d in range(n)])   # every GPU, one process
    with sc.Comm.group():                      # one thread issuing for several GPUs
        for c, x in zip(comms, xs):
            c.all_reduce(x)

Every call is checked by the library (docs: the top of comm.h); the Python layer checks
the argument kinds first (TypeError, ValueError) and raises the library's failures as the
package's exception classes with its message (TimeoutError, CommError, NoNcclError, ...).
"""

import contextlib
import enum
import types
from ctypes import byref, c_int, c_uint64, create_string_buffer, string_at

from . import _lib
from ._core import Context, View, _check, _Resource, _stream_handle
from ._lib import caller_site, label_bytes, lib

__all__ = ["Comm", "ReduceOp"]

_U32_MAX = (1 << 32) - 1
_U64_MAX = (1 << 64) - 1


class ReduceOp(enum.IntEnum):
    """sc_reduce_op. Wherever an operation is taken, its name ("sum", "prod", "min",
    "max", "avg") may be given."""
    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4  # the sum divided by nranks: floating-point types (not fp8) only


def _op(fn, op):
    if isinstance(op, ReduceOp):
        return int(op)
    if isinstance(op, str):
        try:
            return int(ReduceOp[op.upper()])
        except KeyError:
            raise ValueError(f"Comm.{fn}: unknown reduction {op!r} (one of: sum, prod, min, "
                             f"max, avg)") from None
    raise TypeError(f"Comm.{fn}: op must be a name (\"sum\", \"prod\", \"min\", \"max\", "
                    f"\"avg\") or a safecuda.ReduceOp, not {type(op).__name__}")


def _view(fn, name, v):
    if isinstance(v, View):
        return v._sv
    raise TypeError(f"Comm.{fn}: {name} is {type(v).__name__}; collectives take safecuda "
                    f"Views or Buffers of the communicator's context (copy host memory in "
                    f"with Context.from_host; safecuda.torch.Comm takes torch tensors)")


def _stream(fn, stream):
    try:
        return _stream_handle(stream)
    except TypeError:
        raise TypeError(f"Comm.{fn}: stream must be a safecuda.Stream of the "
                        f"communicator's context or None (its default stream), not "
                        f"{type(stream).__name__}") from None


def _timeout(fn, timeout_ms):
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int):
        raise TypeError(f"Comm.{fn}: timeout_ms must be an int (milliseconds; 0: the default "
                        f"of {_lib.SC_COMM_DEFAULT_TIMEOUT_MS} ms), not "
                        f"{type(timeout_ms).__name__}")
    if not 0 <= timeout_ms <= _U32_MAX:
        raise ValueError(f"Comm.{fn}: timeout_ms {timeout_ms} is outside 0 .. {_U32_MAX}")
    return timeout_ms


def _int(fn, name, value):
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"Comm.{fn}: {name} must be an int, not {type(value).__name__}")
    return int(value.__index__())


def _counts(fn, name, values, nranks, required=True):
    """A (c_uint64 * nranks) array of the counts or offsets, or None."""
    if values is None:
        if required:
            raise TypeError(f"Comm.{fn}: {name} is required ({nranks} element counts, one "
                            f"per rank)")
        return None
    try:
        seq = list(values.tolist() if hasattr(values, "tolist") else values)
    except TypeError:
        raise TypeError(f"Comm.{fn}: {name} must be a sequence of {nranks} ints, not "
                        f"{type(values).__name__}") from None
    if len(seq) != nranks:
        raise ValueError(f"Comm.{fn}: {name} has {len(seq)} entries; the communicator has "
                         f"{nranks} ranks (one entry per rank)")
    out = (c_uint64 * nranks)()
    for i, v in enumerate(seq):
        v = _int(fn, f"{name}[{i}]", v)
        if not 0 <= v <= _U64_MAX:
            raise ValueError(f"Comm.{fn}: {name}[{i}] = {v} is outside 0 .. 2**64 - 1")
        out[i] = v
    return out


def _id_struct(fn, unique_id):
    try:
        raw = bytes(memoryview(unique_id))
    except TypeError:
        raise TypeError(f"Comm.{fn}: unique_id must be the bytes of Comm.unique_id(), not "
                        f"{type(unique_id).__name__}") from None
    if len(raw) != _lib.SC_COMM_ID_BYTES:
        raise ValueError(f"Comm.{fn}: unique_id has {len(raw)} bytes; Comm.unique_id() gives "
                         f"{_lib.SC_COMM_ID_BYTES}")
    sid = _lib.sc_comm_id()
    sid.bytes[:] = raw
    return sid


class Comm(_Resource):
    """One rank of a communicator, on its context's device (sc_comm). Comm(context,
    unique_id, nranks, rank, timeout_ms=0, label=None) joins the ranks that use the same
    unique_id (one process or thread per rank; it returns once all have joined, or raises
    TimeoutError after timeout_ms); Comm.create_all(contexts) makes every rank in this
    process. close() waits for its work and frees it (also `with`); a context's close frees
    the communicators still open in it, reported as leaks."""

    _kind = "communicator"
    _destroy_fn = "sc_comm_destroy"

    def __init__(self, context, unique_id, nranks, rank, *, timeout_ms=0, label=None):
        if not isinstance(context, Context):
            raise TypeError(f"Comm: context must be a safecuda.Context, not "
                            f"{type(context).__name__}")
        sid = _id_struct("__init__", unique_id)
        nranks = _int("__init__", "nranks", nranks)
        rank = _int("__init__", "rank", rank)
        if nranks < 1:
            raise ValueError(f"Comm: nranks is {nranks}; a communicator has at least 1 rank")
        if not 0 <= rank < nranks:
            raise ValueError(f"Comm: rank {rank} is outside 0 .. {nranks - 1} (nranks "
                             f"{nranks})")
        desc = _lib.sc_comm_desc(sid, nranks, rank, _timeout("__init__", timeout_ms),
                                 label_bytes(label))
        h = c_uint64()
        file, line = caller_site()
        _check(lib.sc_comm_create_at(context._h, byref(desc), byref(h), file, line))
        self._setup(context, h.value, label, (string_at(file).decode(), line), rank, nranks)

    def _setup(self, ctx, handle, label, site, rank, nranks):
        self._rank, self._nranks = rank, nranks
        self._init_resource(ctx, handle, label, site)

    @classmethod
    def create_all(cls, contexts, *, timeout_ms=0, label=None):
        """One communicator per context, all of one group: result[i] is rank i, on
        contexts[i]'s device (each device once). All or nothing."""
        try:
            ctxs = list(contexts)
        except TypeError:
            raise TypeError(f"Comm.create_all: contexts must be a sequence of "
                            f"safecuda.Context, not {type(contexts).__name__}") from None
        if not ctxs:
            raise ValueError("Comm.create_all: no contexts (one per GPU, at least 1)")
        for i, c in enumerate(ctxs):
            if not isinstance(c, Context):
                raise TypeError(f"Comm.create_all: contexts[{i}] is {type(c).__name__}, not "
                                f"a safecuda.Context")
        n = len(ctxs)
        hs = (c_uint64 * n)(*[c._h for c in ctxs])
        out = (c_uint64 * n)()
        desc = _lib.sc_comm_all_desc(_timeout("create_all", timeout_ms), label_bytes(label))
        file, line = caller_site()
        _check(lib.sc_comm_create_all_at(hs, n, byref(desc), out, file, line))
        site = (string_at(file).decode(), line)
        comms = []
        for i, c in enumerate(ctxs):
            comm = cls.__new__(cls)
            comm._setup(c, out[i], label if label is not None else "comm", site, i, n)
            comms.append(comm)
        return comms

    # ---- the NCCL library and ids -------------------------------------------------------

    @staticmethod
    def unique_id():
        """A new unique id: 128 bytes made on one rank and given to every rank (pickle,
        a socket, torch.distributed: safecuda.torch.Comm.from_process_group does that)."""
        sid = _lib.sc_comm_id()
        _check(lib.sc_comm_unique_id(byref(sid)))
        return bytes(sid.bytes)

    @staticmethod
    def library_version():
        """The loaded NCCL's version as NCCL codes it (22809 for 2.28.9); NoNcclError
        (with where it looked) when none is usable."""
        v = c_int()
        _check(lib.sc_comm_library_version(byref(v)))
        return v.value

    @staticmethod
    def library_path():
        """The path of the loaded libnccl (NoNcclError when none is usable)."""
        buf = create_string_buffer(4096)
        _check(lib.sc_comm_library_path(buf, len(buf)))
        return buf.value.decode("utf-8", "replace")

    @staticmethod
    @contextlib.contextmanager
    def group():
        """The collectives this thread calls inside the `with` are issued together at its
        end (sc_comm_group_begin / _end): one thread's calls for several GPUs, or sends and
        receives that must progress together. Groups nest. An exception inside still ends
        the group (what was added is issued; peers that miss their part time out)."""
        _check(lib.sc_comm_group_begin())
        try:
            yield
        except BaseException:
            lib.sc_comm_group_end()  # the body's exception is the one that matters
            raise
        _check(lib.sc_comm_group_end())

    # ---- the communicator ---------------------------------------------------------------

    @property
    def rank(self):
        return self._rank

    @property
    def nranks(self):
        return self._nranks

    def _detail(self):
        return f"rank {self._rank} of {self._nranks}"

    def __repr__(self):
        state = "open" if self._open else "closed"
        return (f"<safecuda.Comm {self._label or hex(self._h)}: rank {self._rank} of "
                f"{self._nranks} ({state})>")

    def abort(self):
        """Abort now (ncclCommAbort): work in flight stops, its outputs undefined; later
        calls raise CommError; close() remains to do."""
        _check(lib.sc_comm_abort(self._h))

    def info(self):
        """rank, nranks, device, timeout_ms, context (the Context), label, file, line,
        aborted."""
        p = _lib.sc_comm_props()
        _check(lib.sc_comm_info(self._h, byref(p)))
        return types.SimpleNamespace(
            rank=p.rank, nranks=p.nranks, device=p.device, timeout_ms=p.timeout_ms,
            context=self._ctx, label=p.label.decode("utf-8", "replace"),
            file=p.file.decode("utf-8", "replace") if p.file else None, line=p.line,
            aborted=bool(p.aborted))

    def synchronize(self):
        """Wait for every collective issued on it; TimeoutError / CommError when it was
        aborted (the message names the collective and why)."""
        _check(lib.sc_comm_synchronize(self._h))

    def query(self):
        """True when every collective issued on it has finished (never waits)."""
        r = lib.sc_comm_query(self._h)
        if r == _lib.Status.SC_ERR_NOT_READY:
            return False
        _check(r)
        return True

    # ---- collectives (views of the communicator's context; stream None: its default) --

    def all_reduce(self, dst, src=None, op="sum", *, stream=None):
        """dst = op over the ranks of src (src None: dst, in place)."""
        d = _view("all_reduce", "dst", dst)
        s = d if src is None else _view("all_reduce", "src", src)
        o = _op("all_reduce", op)
        _check(lib.sc_comm_all_reduce(self._h, _stream("all_reduce", stream), d, s, o))

    def reduce_scatter(self, dst, src, op="sum", *, stream=None):
        """The reduction of src (nranks x n) over the ranks; rank r's dst (n) gets part r."""
        d = _view("reduce_scatter", "dst", dst)
        s = _view("reduce_scatter", "src", src)
        o = _op("reduce_scatter", op)
        _check(lib.sc_comm_reduce_scatter(self._h, _stream("reduce_scatter", stream), d, s, o))

    def all_gather(self, dst, src, *, stream=None):
        """Every rank's src (n) into every rank's dst (nranks x n), rank r's at part r."""
        d = _view("all_gather", "dst", dst)
        s = _view("all_gather", "src", src)
        _check(lib.sc_comm_all_gather(self._h, _stream("all_gather", stream), d, s))

    def all_to_all(self, dst, src, *, stream=None):
        """src's part p (of nranks equal parts) goes to rank p; dst's part p comes from p."""
        d = _view("all_to_all", "dst", dst)
        s = _view("all_to_all", "src", src)
        _check(lib.sc_comm_all_to_all(self._h, _stream("all_to_all", stream), d, s))

    def all_to_all_v(self, dst, recv_counts, src, send_counts, *, recv_offsets=None,
                     send_offsets=None, stream=None):
        """send_counts[p] elements of src (at send_offsets[p]) go to rank p; recv_counts[p]
        from rank p land in dst at recv_offsets[p]. Counts and offsets: nranks ints each
        (elements, relative to the views); offsets None: packed in rank order."""
        fn, n = "all_to_all_v", self._nranks
        d = _view(fn, "dst", dst)
        s = _view(fn, "src", src)
        rc = _counts(fn, "recv_counts", recv_counts, n)
        sc = _counts(fn, "send_counts", send_counts, n)
        ro = _counts(fn, "recv_offsets", recv_offsets, n, required=False)
        so = _counts(fn, "send_offsets", send_offsets, n, required=False)
        _check(lib.sc_comm_all_to_all_v(self._h, _stream(fn, stream), d, rc, ro, s, sc, so))

    def send(self, src, peer, *, stream=None):
        """Send src to rank peer (which calls recv with the same count and dtype)."""
        s = _view("send", "src", src)
        _check(lib.sc_comm_send(self._h, _stream("send", stream), s, self._peer("send", peer)))

    def recv(self, dst, peer, *, stream=None):
        """Receive from rank peer into dst (see send)."""
        d = _view("recv", "dst", dst)
        _check(lib.sc_comm_recv(self._h, _stream("recv", stream), d, self._peer("recv", peer)))

    def _peer(self, fn, peer):
        """peer as an int rank of this communicator (Comm.fn's ValueError otherwise)."""
        p = _int(fn, "peer", peer)
        if not 0 <= p < self._nranks:
            raise ValueError(f"Comm.{fn}: peer {p} is outside 0 .. {self._nranks - 1}")
        return p

