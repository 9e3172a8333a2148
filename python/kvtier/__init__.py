"""kvtier: KV-cache tiering (GPU -> pinned host -> disk) for LLM inference.

A thin binding of the C library libkvtier (carried in this package) through
cffi's ABI mode. Every C call releases the GIL while it runs, so waits
(Request.wait, Job.wait, Cache.drain, a blocking Cache.acquire) let other
Python threads run. One Cache may be used from any number of threads, as the
C API allows; only opening, register_layout and close must not race other
calls on the same cache.

Keys are 16 bytes each (kvt_key: lo, hi as little-endian uint64). Functions
that return keys return a numpy array of shape (n, 2) and dtype uint64;
functions that take keys accept such an array, any C-contiguous array whose
last dimension is 16 bytes, bytes-like objects of n * 16 bytes, or a list of
16-byte bytes, or a CPU torch tensor of such a shape. Engine memory (the KV pool) is passed zero-copy as a numpy
array, a memoryview or other writable buffer, a torch tensor (its data_ptr),
or a raw address (int).
"""

import enum
import errno as _errno
import math
import threading
from collections import namedtuple

import numpy as np

from ._cdef import ERRORS as _ERRORS
from ._lib import LIBRARY_PATH, ffi, lib  # noqa: F401 (lib: the raw C functions)

__all__ = [
    "Cache", "Config", "BlockState", "set_log_handler", "ModelDesc", "HwDesc", "Plan", "Stats", "Request", "Job", "Segment",
    "KvtError", "Dtype", "Device", "DiskBackend", "WritePolicy", "Tier", "Decision",
    "version", "version_number", "strerror", "config_defaults", "layout_defaults",
    "model_preset_names", "cost_plan", "cost_breakeven", "cost_recompute_flops",
    "cost_compute_s", "cost_transfer_s", "keys_to_bytes",
    "LIBRARY_PATH", "LogLevel", "OK", "INPROGRESS", "STORE_EVICT", "ACQUIRE_NOWAIT",
    "LAYOUT_METADATA_ONLY", "MAP_BYTES_PER_BLOCK", "LAYOUT_STORAGE", "KEYS_OPAQUE", "GET_PROMOTE", "MEM_HOST", "MEM_DEVICE", "MEM_HOST_FIXED",
    "REGION_NONE", "PIECE_DTYPE", "StorageJob", "LookupResult", "pieces",
] + list(_ERRORS)

OK = 0
INPROGRESS = 1
STORE_EVICT = 0x1
ACQUIRE_NOWAIT = 0x1
LAYOUT_METADATA_ONLY = 0x1
MAP_BYTES_PER_BLOCK = 100
LAYOUT_STORAGE = 0x2
KEYS_OPAQUE = 0x1
GET_PROMOTE = 0x2
MEM_HOST = 0
MEM_DEVICE = 1
MEM_HOST_FIXED = 2  # pinned for io_uring fixed buffers: its pages must stay put while registered
REGION_NONE = 0
globals().update(_ERRORS)
_ERROR_NAMES = {v: "KVT_" + k for k, v in _ERRORS.items()}


class Dtype(enum.IntEnum):
    F16 = 1
    BF16 = 2
    F32 = 3
    FP8_E4M3 = 4
    FP8_E5M2 = 5
    INT8 = 6
    OTHER = 255


class Device(enum.IntEnum):
    AUTO = 0
    HOST = 1
    CUDA = 2


class DiskBackend(enum.IntEnum):
    AUTO = 0
    URING = 1
    THREADS = 2


class WritePolicy(enum.IntEnum):
    BACK = 0
    THROUGH = 1


class Tier(enum.IntEnum):
    DEVICE = 0
    HOST = 1
    DISK = 2
    REMOTE = 3   # only on the remote tier (a Config with remote_url)
    NONE = 255


class BlockState(enum.IntEnum):
    """Per-block outcome of a restore (Request.block_states)."""
    READY = 0    # holds valid KV (restored or a device hit): do not write it
    FAILED = 1   # its copy failed (I/O error, checksum, mismatch): compute it
    COMPUTE = 2  # not restored (a miss, past the plan, cancelled after a failure): compute it


class LogLevel(enum.IntEnum):
    NONE = -1  # as a cache's log_level: no messages
    ERROR = 0
    WARN = 1
    INFO = 2


class Decision(enum.IntEnum):
    RECOMPUTE = 0
    RESTORE = 1
    SPLIT = 2


# --------------------------------------------------------------------------
# Version and errors
# --------------------------------------------------------------------------

def version():
    """The linked library's version string, e.g. "0.1.0"."""
    return ffi.string(lib.kvt_version()).decode()


def version_number():
    """The linked library's KVT_VERSION_NUMBER (major * 10000 + minor * 100 + patch)."""
    return lib.kvt_version_number()


def strerror(code):
    """kvt_strerror: the text of any return code (0, 1, -errno, KVT_E*)."""
    return ffi.string(lib.kvt_strerror(int(code))).decode()


class KvtError(Exception):
    """A negative return code of the C library.

    code: the code (-errno or a KVT_E* value); name: "KVT_EMISS", "ENOENT"...;
    text: kvt_strerror(code); call: the C function that returned it.
    """

    def __init__(self, code, call=None, detail=""):
        self.code = int(code)
        self.detail = detail
        self.name = _ERROR_NAMES.get(self.code) or _errno.errorcode.get(-self.code, "unknown")
        self.text = strerror(self.code)
        self.call = call
        where = "%s: " % call if call else ""
        more = " [%s]" % detail if detail else ""
        super().__init__("%s%s (%s, %d)%s" % (where, self.text, self.name, self.code, more))


def _check(rc, call):
    if rc < 0:
        raise KvtError(rc, call)
    return rc


_log_callback = None  # the installed cffi callback
# Replaced callbacks stay alive: the library may still be running one on
# another thread just after kvt_set_log_handler returns (a few bytes each).
_retired_log_callbacks = []


def set_log_handler(handler):
    """Installs the process-wide handler of the library's log messages
    (kvt_set_log_handler): handler(level: LogLevel, message: str), or
    "logging" to send them to logging.getLogger("kvtier"), or None (default:
    warnings and errors go to stderr; a cache's log_level filters them). The handler runs on whichever thread noticed
    the event, library threads included, holding the GIL; it must not call
    into a cache. Exceptions it raises are printed and otherwise ignored."""
    global _log_callback
    if handler == "logging":
        import logging
        logger = logging.getLogger("kvtier")
        levels = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO}

        def handler(level, message):
            logger.log(levels.get(int(level), logging.INFO), "%s", message)
    elif handler is not None and not callable(handler):
        raise TypeError('set_log_handler: a callable(level, message), "logging" or None, not %r' % (handler,))
    if handler is None:
        lib.kvt_set_log_handler(ffi.NULL, ffi.NULL)
        if _log_callback is not None:
            _retired_log_callbacks.append(_log_callback)
        _log_callback = None
        return

    def trampoline(ctx, level, msg):
        handler(LogLevel(level) if level in (0, 1, 2) else level, ffi.string(msg).decode(errors="replace"))

    cb = ffi.callback("kvt_log_fn", trampoline)
    lib.kvt_set_log_handler(cb, ffi.NULL)
    if _log_callback is not None:
        _retired_log_callbacks.append(_log_callback)
    _log_callback = cb


# --------------------------------------------------------------------------
# Structs: attribute access over the C struct, to_dict() for a plain copy
# --------------------------------------------------------------------------

class _Struct:
    _ctype = None
    _enums = {}

    def __init__(self, cdata=None):
        if cdata is None:
            cdata = ffi.new(self._ctype + " *")
        object.__setattr__(self, "_c", cdata)
        object.__setattr__(self, "_keep", {})

    @classmethod
    def _fields(cls):
        return [name for name, _ in ffi.typeof(cls._ctype).fields]

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            value = getattr(self._c, name)
        except AttributeError:
            raise AttributeError("%s has no field %r" % (type(self).__name__, name)) from None
        if isinstance(value, ffi.CData):
            kind = ffi.typeof(value).kind
            if kind == "array":
                return ffi.string(value).decode()
            if kind == "pointer":
                return ffi.string(value).decode() if value != ffi.NULL else None
            if kind == "struct":
                return _Link(value)
        if name in self._enums:
            return self._enums[name](value)
        return value

    def __setattr__(self, name, value):
        if name == "size":
            raise AttributeError("size is set by the library's init function")
        try:
            ctype = ffi.typeof(self._c).item.fields
            field = dict(ctype)[name].type
        except KeyError:
            raise AttributeError("%s has no field %r" % (type(self).__name__, name)) from None
        if field.kind == "array":
            raw = value.encode() if isinstance(value, str) else bytes(value)
            if len(raw) >= field.length:
                raise ValueError("%s: at most %d bytes" % (name, field.length - 1))
            setattr(self._c, name, raw)
        elif field.kind == "pointer":  # const char *: keep the bytes alive here
            if value is None:
                self._keep.pop(name, None)
                setattr(self._c, name, ffi.NULL)
            else:
                raw = value.encode() if isinstance(value, str) else bytes(value)
                buf = ffi.new("char[]", raw)
                self._keep[name] = buf
                setattr(self._c, name, buf)
        elif field.kind == "struct":
            link = getattr(self._c, name)
            if isinstance(value, dict):
                for k, v in value.items():
                    setattr(link, k, v)
            else:
                link.bytes_per_s, link.latency_s = value
        else:
            setattr(self._c, name, int(value) if field.kind == "enum" else value)

    def to_dict(self):
        out = {}
        for name in self._fields():
            value = getattr(self, name)
            out[name] = value.to_dict() if isinstance(value, _Link) else value
        return out

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % kv for kv in self.to_dict().items()))


class _Link(_Struct):
    """A copy path (kvt_link): bytes_per_s, latency_s; a view into its parent."""
    _ctype = "kvt_link"


class Config(_Struct):
    """kvt_config with kvt_config_init's defaults; fields are keyword arguments."""
    _ctype = "kvt_config"
    _enums = {"dtype": Dtype, "device": Device, "disk_backend": DiskBackend, "write_policy": WritePolicy}

    def __init__(self, **fields):
        super().__init__()
        lib.kvt_config_init(self._c)
        for k, v in fields.items():
            setattr(self, k, v)


class ModelDesc(_Struct):
    """kvt_model_desc (kvt_model_init's defaults), or a preset: ModelDesc.preset("llama3-8b")."""
    _ctype = "kvt_model_desc"

    def __init__(self, **fields):
        super().__init__()
        lib.kvt_model_init(self._c)
        for k, v in fields.items():
            setattr(self, k, v)

    @classmethod
    def preset(cls, name, **fields):
        m = cls()
        _check(lib.kvt_model_preset(name.encode(), m._c), "kvt_model_preset")
        for k, v in fields.items():
            setattr(m, k, v)
        return m

    def kv_bytes_per_token(self):
        """KV bytes per token over all layers; 0 for an invalid model."""
        return lib.kvt_model_kv_bytes_per_token(self._c)

    def param_count(self):
        """Parameters active per token (params, or derived from the shape); 0 if invalid."""
        return lib.kvt_model_params(self._c)


class HwDesc(_Struct):
    """kvt_hw_desc with kvt_hw_init's defaults (H100, PCIe, NVMe)."""
    _ctype = "kvt_hw_desc"

    def __init__(self, **fields):
        super().__init__()
        lib.kvt_hw_init(self._c)
        for k, v in fields.items():
            setattr(self, k, v)


class Plan(_Struct):
    """kvt_plan: a plan from Cache.plan_request or cost_plan (read it, do not fill it)."""
    _ctype = "kvt_plan"
    _enums = {"decision": Decision}

    def __init__(self):
        super().__init__()
        self._c.size = ffi.sizeof("kvt_plan")


class Stats(_Struct):
    """kvt_stats: a snapshot of the cache's counters."""
    _ctype = "kvt_stats"

    def __init__(self):
        super().__init__()
        self._c.size = ffi.sizeof("kvt_stats")


def config_defaults():
    """kvt_config_init's defaults as a dict."""
    return Config().to_dict()


def layout_defaults():
    """kvt_layout_init's defaults as a dict (segments as an address, 0 = NULL)."""
    lay = ffi.new("kvt_layout *")
    lib.kvt_layout_init(lay)
    return {name: (int(ffi.cast("uintptr_t", getattr(lay, name))) if name == "segments" else getattr(lay, name))
            for name, _ in ffi.typeof("kvt_layout").fields}


def model_preset_names():
    """Names of the built-in model presets."""
    names, i = [], 0
    while True:
        p = lib.kvt_model_preset_name(i)
        if p == ffi.NULL:
            return names
        names.append(ffi.string(p).decode())
        i += 1


# --------------------------------------------------------------------------
# Cost model (pure functions)
# --------------------------------------------------------------------------

def cost_recompute_flops(model, start, stop):
    """FLOPs to recompute tokens [start, stop) after a cached prefix of start: (total, linear part)."""
    linear = ffi.new("double *")
    total = lib.kvt_cost_recompute_flops(model._c, start, stop, linear)
    return total, linear[0]


def cost_compute_s(model, hw, start, stop):
    """Seconds to compute tokens [start, stop) on hw; 0 for invalid arguments."""
    return lib.kvt_cost_compute_s(model._c, hw._c, start, stop)


def cost_transfer_s(hw, host_bytes, disk_bytes):
    """Seconds to bring host_bytes and disk_bytes to the device; 0 for invalid arguments."""
    return lib.kvt_cost_transfer_s(hw._c, host_bytes, disk_bytes)


def cost_plan(model, hw, block_tokens, n_tokens, tier_of_block=()):
    """The planner on its own: tier_of_block lists the fastest tier (Tier) of each cached block."""
    tiers = np.ascontiguousarray(tier_of_block, dtype=np.uint8)
    plan = Plan()
    ptr = ffi.from_buffer("uint8_t[]", tiers) if tiers.size else ffi.NULL
    _check(lib.kvt_cost_plan(model._c, hw._c, block_tokens, n_tokens, tiers.size, ptr, plan._c), "kvt_cost_plan")
    return plan


def cost_breakeven(model, hw, n_tokens, cached_tokens):
    """device_host bytes/s at which restoring cached_tokens ties recomputing (inf: never)."""
    out = ffi.new("double *")
    _check(lib.kvt_cost_breakeven(model._c, hw._c, n_tokens, cached_tokens, out), "kvt_cost_breakeven")
    return out[0]


# --------------------------------------------------------------------------
# Keys, tokens and buffers
# --------------------------------------------------------------------------

def _as_keys(keys):
    """(kvt_key * cdata, n, owner) for any accepted key container, zero-copy where possible."""
    if isinstance(keys, (list, tuple)):
        if keys and not isinstance(keys[0], (bytes, bytearray, memoryview)):
            keys = np.asarray(keys, dtype=np.uint64)  # [[lo, hi], ...]
        else:
            if any(len(k) != 16 for k in keys):
                raise ValueError("each key must be 16 bytes")
            keys = b"".join(bytes(k) for k in keys)
    if hasattr(keys, "data_ptr") and hasattr(keys, "numpy"):  # a CPU torch tensor: its numpy view
        keys = keys.detach().numpy()
    if isinstance(keys, np.ndarray):
        if keys.ndim == 0 or keys.shape[-1] * keys.dtype.itemsize != 16:
            if not (keys.dtype.itemsize == 16 and keys.ndim >= 1):
                raise ValueError("keys: the last dimension must hold 16 bytes, e.g. shape (n, 2) uint64")
        arr = keys
    else:
        arr = np.frombuffer(keys, dtype=np.uint8)
        if arr.size % 16:
            raise ValueError("keys: %d bytes is not a multiple of 16" % arr.size)
    # kvt_key holds uint64s: hand the library aligned, contiguous memory.
    if not arr.flags.c_contiguous or arr.ctypes.data % 8:
        arr = np.ascontiguousarray(arr).copy()
    n = arr.nbytes // 16
    if n == 0:
        return ffi.NULL, 0, arr
    return ffi.cast("kvt_key *", arr.ctypes.data), n, arr


def _new_keys(n):
    return np.zeros((n, 2), dtype=np.uint64)


def keys_to_bytes(keys):
    """The keys as bytes, 16 per key (lo then hi, little-endian)."""
    _, _, arr = _as_keys(keys)
    return arr.tobytes()


def _as_tokens(tokens, n_expected=None):
    if tokens is None:
        return ffi.NULL, None
    arr = np.ascontiguousarray(tokens, dtype=np.uint32)
    if n_expected is not None and arr.size < n_expected:
        raise ValueError("tokens: expected %d ids (blocks x block_tokens), got %d" % (n_expected, arr.size))
    if arr.size == 0:
        return ffi.NULL, arr
    return ffi.cast("uint32_t *", arr.ctypes.data), arr


def _address(obj):
    """(address, nbytes or None, owner) of a writable buffer, a torch tensor or an int."""
    if isinstance(obj, int):
        return obj, None, None
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch.Tensor
        if not obj.is_contiguous():
            raise ValueError("tensor must be contiguous")
        return int(obj.data_ptr()), obj.numel() * obj.element_size(), obj
    buf = ffi.from_buffer(obj, require_writable=True)
    return int(ffi.cast("uintptr_t", buf)), len(buf), buf


def _stream(stream):
    if stream is None:
        return ffi.NULL
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        stream = stream.cuda_stream
    return ffi.cast("void *", int(stream))


def _timeout_ns(timeout):
    """Seconds to the library's nanoseconds: None or inf = forever (-1),
    negative = 0 (poll); beyond int64 nanoseconds (292 years) = forever."""
    if timeout is None:
        return -1
    if math.isnan(timeout):  # a TypeError for what is not a number
        raise ValueError("timeout: NaN is not a number of seconds")
    ns = max(0.0, timeout) * 1e9
    return -1 if ns >= 2.0 ** 63 else int(ns)


# One kvt_piece (fixed ABI, like iovec): ptr, region, reserved, offset, len.
PIECE_DTYPE = np.dtype([("ptr", "<u8"), ("region", "<u4"), ("reserved", "<u4"), ("offset", "<u8"),
                        ("len", "<u8")])


def pieces(lengths, addresses=None, region=REGION_NONE, offsets=None):
    """A piece table (numpy array of PIECE_DTYPE) for put_from / get_into,
    built without a Python loop: host addresses (region REGION_NONE), or
    offsets into a registered region. lengths, addresses and offsets
    broadcast against each other (one length for every piece is fine)."""
    if (addresses is None) == (offsets is None):
        raise ValueError("pieces: give addresses (host memory) or offsets (into a region)")
    where = np.asarray(addresses if offsets is None else offsets, dtype=np.uint64)
    lens = np.asarray(lengths, dtype=np.uint64)
    where, lens = np.broadcast_arrays(where.reshape(-1), lens.reshape(-1))
    out = np.zeros(where.shape[0], dtype=PIECE_DTYPE)
    if offsets is None:
        out["ptr"] = where
    else:
        if region == REGION_NONE:
            raise ValueError("pieces: offsets need a registered region")
        out["region"] = region
        out["offset"] = where
    out["len"] = lens
    return out


def _readable_address(obj, writable=False):
    """(address, nbytes, owner) of any buffer (read-only ones too unless
    writable), a torch tensor or a numpy array."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):
        return _address(obj)
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise ValueError("array must be C-contiguous")
        if writable and not obj.flags.writeable:
            raise ValueError("array is read-only: get_into writes into its pieces")
        return int(obj.ctypes.data), obj.nbytes, obj
    buf = ffi.from_buffer(obj, require_writable=writable)
    return int(ffi.cast("uintptr_t", buf)), len(buf), buf


def _as_pieces(spec, writable=False):
    """(kvt_piece * cdata, n, owners) of a piece table: an array of PIECE_DTYPE,
    or a list whose items are a buffer / numpy array / torch tensor (all of
    its bytes), (address or buffer, len), or (region, offset, len).
    writable: the buffers named are destinations (get_into), so read-only
    ones (bytes, read-only arrays) are refused."""
    if isinstance(spec, np.ndarray) and spec.dtype == PIECE_DTYPE:
        arr = np.ascontiguousarray(spec)
        return ffi.cast("kvt_piece *", arr.ctypes.data), arr.shape[0], [arr]
    spec = list(spec)
    arr = np.zeros(len(spec), dtype=PIECE_DTYPE)
    owners = [arr]
    for i, item in enumerate(spec):
        if isinstance(item, tuple) and len(item) == 3:
            arr[i]["region"], arr[i]["offset"], arr[i]["len"] = item
            continue
        if isinstance(item, tuple) and len(item) == 2:
            base, length = item
            addr, size, owner = (base, None, None) if isinstance(base, int) else _readable_address(base, writable)
            if size is not None and length > size:
                raise ValueError("piece %d: %d bytes asked of a %d-byte buffer" % (i, length, size))
        else:
            addr, length, owner = _readable_address(item, writable)
        arr[i]["ptr"], arr[i]["len"] = addr, length
        owners.append(owner)
    return ffi.cast("kvt_piece *", arr.ctypes.data), arr.shape[0], owners


Segment = namedtuple("Segment", "base stride bytes")
Segment.__doc__ = "One segment of one layer: block slot s is `bytes` bytes at base + s * stride."
LookupResult = namedtuple("LookupResult", "n_blocks n_prefix n_device n_host n_disk tiers")
AcquireInfo = namedtuple("AcquireInfo", "n_restore n_device_hits n_loading n_from_disk")


# --------------------------------------------------------------------------
# Requests and jobs
# --------------------------------------------------------------------------

class Request:
    """A request in flight (kvt_req). Its blocks hold device slots until release().

    slots: numpy uint32 array, the slot of each keyed block then each extra slot.
    info: AcquireInfo. loading: True when loads were in flight at acquire.
    A context manager: leaving the block releases the request.
    """

    def __init__(self, cache, handle, slots, info, loading, n_blocks):
        self._cache = cache
        self.handle = handle
        self.slots = slots
        self.info = info
        self.loading = loading
        self.n_blocks = n_blocks
        self.released = False

    def poll(self):
        """(done, n_ready): n_ready leading blocks are valid; final once done."""
        n = ffi.new("uint32_t *")
        rc = _check(self._cache._call(lib.kvt_request_poll, self.handle, n), "kvt_request_poll")
        return rc == 0, n[0]

    def wait(self, timeout=None):
        """Waits for the loads (timeout in seconds, None = forever); returns n_ready.
        Blocks [n_ready, info.n_restore) failed to load and must be recomputed.
        Raises KvtError ETIMEDOUT when the timeout passes first."""
        n = ffi.new("uint32_t *")
        _check(self._cache._call(lib.kvt_request_wait, self.handle, _timeout_ns(timeout), n), "kvt_request_wait")
        return n[0]

    def layer_ready(self, layer):
        """True once layer `layer` of every loading block has landed (provisional)."""
        return _check(self._cache._call(lib.kvt_request_layer_ready, self.handle, layer),
                      "kvt_request_layer_ready") == 0

    def wait_layer(self, layer, stream=None):
        """CUDA: `stream` waits on the layer's event; host backend: waits here."""
        _check(self._cache._call(lib.kvt_request_wait_layer, self.handle, layer, _stream(stream)),
               "kvt_request_wait_layer")

    def extend(self, keys, tokens=None):
        """The first len(keys) extra slots now hold full blocks with these keys
        (tokens: at least block_tokens ids per key, or None)."""
        kp, n, karr = _as_keys(keys)
        bt = self._cache.block_tokens
        tp, tarr = _as_tokens(tokens, None if tokens is None else n * bt)
        _check(self._cache._call(lib.kvt_request_extend, self.handle, kp, tp, n), "kvt_request_extend")
        self.n_blocks += n

    def commit(self, n_valid=None, stream=None):
        """Keyed blocks [0, n_valid) hold valid KV (default: all keyed blocks)."""
        if n_valid is None:
            n_valid = self.n_blocks
        _check(self._cache._call(lib.kvt_commit, self.handle, n_valid, _stream(stream)), "kvt_commit")

    def block_states(self, n=None):
        """BlockState per keyed block (the first n; default all) once the loads
        are over, as a uint8 array; None while loads are in flight. Never blocks."""
        n = self.n_blocks if n is None else n
        states = np.empty(n, dtype=np.uint8)
        sp = ffi.cast("uint8_t *", states.ctypes.data) if n else ffi.cast("uint8_t *", self.slots.ctypes.data)
        rc = _check(self._cache._call(lib.kvt_request_block_states, self.handle, sp, n),
                    "kvt_request_block_states")
        return None if rc == 1 else states

    def release(self):
        """Unpins the request's blocks (waits for loads in flight)."""
        self.released = True
        _check(self._cache._call(lib.kvt_release, self.handle), "kvt_release")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.released and not self._cache.closed:
            self.release()


class Job:
    """A transfer started by Cache.store or Cache.prefetch (kvt_job).

    started is False when there was nothing to copy (then every call is a
    no-op that succeeds). A context manager: leaving the block releases the
    handle (an unfinished job then completes on its own).
    """

    def __init__(self, cache, handle):
        self._cache = cache
        self.handle = handle
        self.started = handle is not None
        self.released = not self.started

    def poll(self):
        """True when done ok, False while in progress; raises the job's error."""
        if not self.started:
            return True
        return _check(self._cache._call(lib.kvt_job_poll, self.handle), "kvt_job_poll") == 0

    def wait(self, timeout=None):
        """Waits until done (seconds, None = forever); raises the job's error or ETIMEDOUT."""
        if self.started:
            _check(self._cache._call(lib.kvt_job_wait, self.handle, _timeout_ns(timeout)), "kvt_job_wait")

    def cancel(self):
        if self.started:
            _check(self._cache._call(lib.kvt_job_cancel, self.handle), "kvt_job_cancel")

    def release(self):
        if self.started:
            self.released = True
            _check(self._cache._call(lib.kvt_job_release, self.handle), "kvt_job_release")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.released and not self._cache.closed:
            self.release()


class StorageJob:
    """A storage-mode transfer (kvt_put_from / kvt_get_into): n_blocks blocks,
    each with its own result. Keeps the buffers it names alive until released.
    A context manager: leaving the block releases it (an unfinished job then
    completes on its own)."""

    def __init__(self, cache, handle, n_blocks, kind, keep):
        self._cache = cache
        self.handle = handle
        self.n_blocks = n_blocks
        self.kind = kind  # "put" or "get"
        self._keep = keep
        self.released = False

    def _status(self, rc, call):
        if rc in (_ERRORS["ENOJOB"], _ERRORS["ETIMEDOUT"]):
            raise KvtError(rc, call)
        return None if rc == 1 else rc

    def poll(self):
        """None while in flight; then 0 (every block landed or was skipped) or
        the first block's error code (negative). Never blocks."""
        return self._status(self._cache._call(lib.kvt_storage_poll, self.handle), "kvt_storage_poll")

    def done(self):
        return self.poll() is not None

    def wait(self, timeout=None):
        """Waits (seconds, None = forever; the GIL is released) and returns the
        status as poll does; raises KvtError ETIMEDOUT when the time passes first."""
        return self._status(self._cache._call(lib.kvt_storage_wait, self.handle, _timeout_ns(timeout)),
                            "kvt_storage_wait")

    def results(self):
        """(results, n_ok) once finished, None while in flight: results is an
        int32 array, one per block (0 landed, 1 skipped / not loaded, negative:
        that block's error); n_ok the leading run of 0s (for a get, the prefix
        now valid in the engine's memory)."""
        res = np.empty(max(self.n_blocks, 1), dtype=np.int32)
        n_ok = ffi.new("uint32_t *")
        rc = _check(self._cache._call(lib.kvt_storage_results, self.handle,
                                            ffi.cast("int32_t *", res.ctypes.data), self.n_blocks, n_ok),
                    "kvt_storage_results")
        return None if rc == 1 else (res[: self.n_blocks], n_ok[0])

    def release(self):
        """Frees the handle (detaches it while in flight). Idempotent."""
        if self.released:
            return
        self.released = True
        self._cache._storage_jobs.pop(self.handle, None)
        if self._cache.closed:
            # close() may still be waiting for this job in kvt_close: its buffers
            # stay with the cache, which drops them once kvt_close has returned.
            self._cache._keep.append(self._keep)
            self._keep = None
            return
        if self._cache._call(lib.kvt_storage_poll, self.handle) == 1:
            # A detached job still touches its buffers: the cache keeps them until it closes.
            self._cache._keep.append(self._keep)
        self._keep = None
        _check(self._cache._call(lib.kvt_storage_release, self.handle), "kvt_storage_release")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return "StorageJob(%s, handle=%d, n_blocks=%d%s)" % (self.kind, self.handle, self.n_blocks,
                                                             ", released" if self.released else "")


# --------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------

class Cache:
    """A kvtier cache (kvt_cache), opened with a Config or its fields as keywords:

        with kvtier.Cache(model_fingerprint="my-model@rev", device=kvtier.Device.HOST,
                          host_blocks=64, disk_path="/var/cache/kv", disk_blocks=1024) as c:
            c.register_layout(...)

    Close it (or leave the with block) to wait for transfers and free it.
    """

    def __init__(self, config=None, **fields):
        if config is None:
            config = Config(**fields)
        elif fields:
            raise TypeError("pass a Config or keyword fields, not both")
        self.config = config
        self.block_tokens = config.block_tokens
        self._keep = []
        self._storage_jobs = {}  # handle -> StorageJob, until released
        self._regions = {}  # region -> the buffer it names
        self._calls = 0  # C calls in flight on other threads; close() waits for them
        self._calls_cv = threading.Condition(threading.Lock())
        out = ffi.new("kvt_cache **")
        _check(lib.kvt_open(config._c, out), "kvt_open")
        self._c = out[0]

    # Lifecycle --------------------------------------------------------

    @property
    def closed(self):
        return self._c is None

    def _ptr(self):
        if self._c is None:
            raise ValueError("kvtier: the cache is closed")
        return self._c

    def _call(self, fn, *args):
        """fn(cache, *args), counted so that close() in another thread waits for it
        instead of freeing the cache under it."""
        cv = self._calls_cv
        with cv:
            c = self._ptr()
            self._calls += 1
        try:
            return fn(c, *args)
        finally:
            with cv:
                self._calls -= 1
                if self._calls == 0:
                    cv.notify_all()

    @property
    def handle(self):
        """The kvt_cache * as an int, for C code that shares this cache."""
        return int(ffi.cast("uintptr_t", self._ptr()))

    def close(self):
        """Waits for every transfer in flight, then frees the cache. Idempotent.
        Calls other threads are making on this cache finish first (a wait among
        them returns when its job does or times out); calls started after close
        raise ValueError."""
        cv = self._calls_cv
        with cv:
            c, self._c = self._c, None
            while self._calls:
                cv.wait()
        if c is not None:
            lib.kvt_close(c)
        for job in list(self._storage_jobs.values()):
            job.released, job._keep = True, None
        self._storage_jobs = {}
        self._regions = {}
        self._keep = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_c", None) is not None:
            try:
                self.close()
            except Exception:  # interpreter shutdown: the library may be gone already
                pass

    def register_layout(self, num_layers, segments_per_layer, num_slots, segments=None, flags=0):
        """Registers the engine's KV pool: segments lists num_layers * segments_per_layer
        (buffer, stride, bytes) layer-major, each buffer a numpy array, memoryview,
        torch tensor or address. None = metadata only (no bytes move). The cache
        keeps the buffers alive until it is closed. May block."""
        lay = ffi.new("kvt_layout *")
        lib.kvt_layout_init(lay)
        lay.num_layers = num_layers
        lay.segments_per_layer = segments_per_layer
        lay.num_slots = num_slots
        lay.flags = flags
        keep = []
        if segments is None:
            lay.flags |= LAYOUT_METADATA_ONLY
        else:
            segments = list(segments)
            if len(segments) != num_layers * segments_per_layer:
                raise ValueError("expected %d segments (layers x segments per layer), got %d"
                                 % (num_layers * segments_per_layer, len(segments)))
            arr = ffi.new("kvt_segment[]", len(segments))
            for i, seg in enumerate(segments):
                base, stride, nbytes = seg
                addr, size, owner = _address(base)
                if size is not None and num_slots and (num_slots - 1) * stride + nbytes > size:
                    raise ValueError("segment %d: %d slots of stride %d and %d bytes need %d bytes, "
                                     "the buffer has %d" % (i, num_slots, stride, nbytes,
                                                           (num_slots - 1) * stride + nbytes, size))
                arr[i].base = ffi.cast("void *", addr)
                arr[i].stride = stride
                arr[i].bytes = nbytes
                keep.append(owner)
            lay.segments = arr
            keep.append(arr)
        rc = self._call(lib.kvt_register_layout, lay)
        if rc < 0:
            raise KvtError(rc, "kvt_register_layout", self.error_detail())
        self._keep.extend(keep)

    def register_pool(self, pool):
        """Registers a pool shaped (num_layers, segments_per_layer, num_slots, ...):
        a C-contiguous numpy array or torch tensor, one block slot per [l, s, slot]."""
        if pool.ndim < 3:
            raise ValueError("pool: shape (layers, segments per layer, slots, ...) expected")
        layers, segs, slots = (int(x) for x in pool.shape[:3])
        if hasattr(pool, "data_ptr") and hasattr(pool, "element_size"):
            itemsize = pool.element_size()
        else:
            itemsize = pool.itemsize
        per_slot = itemsize
        for d in pool.shape[3:]:
            per_slot *= int(d)
        addr, _, owner = _address(pool)
        seg_stride = slots * per_slot
        segments = [(addr + (l * segs + s) * seg_stride, per_slot, per_slot)
                    for l in range(layers) for s in range(segs)]
        self.register_layout(layers, segs, slots, segments)
        self._keep.append(owner)

    def block_bytes(self):
        """Bytes of one block (0 for metadata only)."""
        return self._call(lib.kvt_block_bytes)

    def error_detail(self):
        """Why the last failed register_layout failed (path or segment at fault), or ""."""
        return ffi.string(self._call(lib.kvt_error_detail)).decode(errors="replace")

    def namespace(self):
        """The namespace key (after register_layout), shape (1, 2) uint64."""
        ns = _new_keys(1)
        _check(self._call(lib.kvt_namespace, ffi.cast("kvt_key *", ns.ctypes.data)), "kvt_namespace")
        return ns

    def device_backend_name(self):
        return ffi.string(self._call(lib.kvt_device_backend_name)).decode()

    def disk_backend_name(self):
        return ffi.string(self._call(lib.kvt_disk_backend_name)).decode()

    # Keys --------------------------------------------------------------

    def hash_tokens(self, tokens, parent=None):
        """Prefix-chained keys of the full blocks of tokens; parent: the key
        before tokens[0] (None: tokens start the sequence)."""
        tp, tarr = _as_tokens(tokens)
        n_tokens = 0 if tarr is None else tarr.size
        n_max = n_tokens // self.block_tokens
        keys = _new_keys(max(n_max, 1))
        pp = ffi.NULL
        if parent is not None:
            pp, pn, parr = _as_keys(parent)
            if pn != 1:
                raise ValueError("parent: one key expected")
        n = ffi.new("size_t *")
        _check(self._call(lib.kvt_hash_tokens, pp, tp if n_tokens else ffi.cast("uint32_t *", keys.ctypes.data),
                                   n_tokens, ffi.cast("kvt_key *", keys.ctypes.data), n_max, n),
               "kvt_hash_tokens")
        return keys[: n[0]]

    def keys_from_opaque(self, opaque, key_bytes=None):
        """kvtier keys for n engine keys of key_bytes each: bytes (key_bytes
        given), a list of equal-length bytes, or an array shaped (n, key_bytes)."""
        if isinstance(opaque, (list, tuple)):
            if not opaque:
                return _new_keys(0)
            key_bytes = len(opaque[0])
            if any(len(k) != key_bytes for k in opaque):
                raise ValueError("opaque keys must all have the same length")
            raw = np.frombuffer(b"".join(bytes(k) for k in opaque), dtype=np.uint8)
        elif isinstance(opaque, np.ndarray):
            raw = np.ascontiguousarray(opaque)
            if key_bytes is None:
                if raw.ndim < 2:
                    raise ValueError("key_bytes is needed for a 1-d array")
                key_bytes = raw.nbytes // raw.shape[0] if raw.shape[0] else 1
            raw = raw.view(np.uint8).reshape(-1)
        else:
            if key_bytes is None:
                raise ValueError("key_bytes is needed for bytes")
            raw = np.frombuffer(opaque, dtype=np.uint8)
        if key_bytes <= 0 or raw.size % key_bytes:
            raise ValueError("%d bytes is not a whole number of %d-byte keys" % (raw.size, key_bytes))
        n = raw.size // key_bytes
        keys = _new_keys(n)
        if n:
            _check(self._call(lib.kvt_keys_from_opaque, ffi.cast("void *", raw.ctypes.data), key_bytes, n,
                                            ffi.cast("kvt_key *", keys.ctypes.data)), "kvt_keys_from_opaque")
        return keys

    # Read path ---------------------------------------------------------

    def lookup(self, keys, tiers=False):
        """Longest cached prefix of keys, split by tier; no side effects. With
        tiers=True, .tiers is a uint8 array of Tier per key (NONE past the prefix)."""
        kp, n, karr = _as_keys(keys)
        res = ffi.new("kvt_lookup_result *")
        res.size = ffi.sizeof("kvt_lookup_result")
        tob = np.empty(n, dtype=np.uint8) if tiers else None
        tp = ffi.cast("uint8_t *", tob.ctypes.data) if tiers and n else ffi.NULL
        _check(self._call(lib.kvt_lookup, kp, n, res, tp), "kvt_lookup")
        return LookupResult(res.n_blocks, res.n_prefix, res.n_device, res.n_host, res.n_disk, tob)

    def plan_request(self, keys, n_tokens):
        """The planner's advice for a request of n_tokens whose full blocks have keys."""
        kp, n, karr = _as_keys(keys)
        plan = Plan()
        _check(self._call(lib.kvt_plan_request, kp, n, n_tokens, plan._c), "kvt_plan_request")
        return plan

    def acquire(self, keys, tokens=None, restore=None, extra_slots=0, nowait=False, parent=None):
        """Device slots for the keyed blocks plus extra_slots; the first `restore`
        (default: all) are restored where cached. tokens: the request's token
        ids (at least block_tokens per keyed block; a trailing partial block
        is ignored), verified against the stored ones (None: no verification).
        parent: the key of the block before keys[0] when keys continue a chain
        (kvt_acquire_after); None: keys start the sequence.
        Returns a Request. May block while evicted blocks are copied down
        (never with nowait=True: KvtError EAGAIN instead)."""
        kp, n, karr = _as_keys(keys)
        tp, tarr = _as_tokens(tokens, None if tokens is None else n * self.block_tokens)
        slots = np.empty(n + extra_slots, dtype=np.uint32)
        req = ffi.new("kvt_req *")
        info = ffi.new("kvt_acquire_info *")
        info.size = ffi.sizeof("kvt_acquire_info")
        sp = ffi.cast("uint32_t *", slots.ctypes.data) if slots.size else ffi.NULL
        pp = ffi.NULL
        if parent is not None:
            pp, pn, parr = _as_keys(parent)
            if pn != 1:
                raise ValueError("parent: one key expected")
        rc = _check(self._call(lib.kvt_acquire_after, pp, kp, tp, n, n if restore is None else restore,
                                          extra_slots, ACQUIRE_NOWAIT if nowait else 0, req, sp, info),
                    "kvt_acquire_after" if parent is not None else "kvt_acquire")
        ai = AcquireInfo(info.n_restore, info.n_device_hits, info.n_loading, info.n_from_disk)
        return Request(self, req[0], slots, ai, rc == 1, n)

    # Write path --------------------------------------------------------

    def store(self, keys, evict=False):
        """Copies the device-resident blocks among keys to the host tier (evict:
        free their device slots once copied). Returns a Job (started is False
        when there was nothing to copy). May block while host slots spill."""
        kp, n, karr = _as_keys(keys)
        job = ffi.new("kvt_job *")
        rc = _check(self._call(lib.kvt_store, kp, n, STORE_EVICT if evict else 0, job), "kvt_store")
        return Job(self, job[0] if rc == 1 else None)

    def prefetch(self, keys):
        """Promotes the disk-resident blocks of keys' cached prefix to the host
        tier. Never waits; KvtError EAGAIN means ask again."""
        kp, n, karr = _as_keys(keys)
        job = ffi.new("kvt_job *")
        rc = _check(self._call(lib.kvt_prefetch, kp, n, job), "kvt_prefetch")
        return Job(self, job[0] if rc == 1 else None)

    def drain(self):
        """Waits until no transfer is in flight (evictions included)."""
        _check(self._call(lib.kvt_drain), "kvt_drain")

    # Cost model ----------------------------------------------------------

    def set_cost_model(self, model, hw=None):
        """The model (ModelDesc) and hardware (HwDesc, default HwDesc()) the planner uses."""
        hw = HwDesc() if hw is None else hw
        _check(self._call(lib.kvt_set_cost_model, model._c, hw._c), "kvt_set_cost_model")

    def report_prefill(self, start, stop, seconds):
        """A measured prefill of tokens [start, stop); later plans follow it."""
        _check(self._call(lib.kvt_report_prefill, start, stop, seconds), "kvt_report_prefill")

    def calibrated_hw(self):
        """The hardware description as calibrated so far (HwDesc)."""
        hw = HwDesc()
        _check(self._call(lib.kvt_get_calibrated_hw, hw._c), "kvt_get_calibrated_hw")
        return hw

    def stats(self):
        """A snapshot of the counters (Stats; .to_dict() for a dict)."""
        st = Stats()
        _check(self._call(lib.kvt_get_stats, st._c), "kvt_get_stats")
        return st

    def metrics(self, format="prometheus"):
        """The cache's metrics (kvt_metrics_write) as a str: "prometheus" for
        the text exposition format, "json" for the same figures as JSON.
        kvtier.prometheus.KvtierCollector exports them to prometheus_client."""
        fmt = {"prometheus": 0, "json": 1}[format]
        size = ffi.new("size_t *", 0)
        while True:
            cap = size[0] + 4096  # counters may gain digits between the calls
            buf = ffi.new("char[]", cap)
            size[0] = cap
            rc = self._call(lib.kvt_metrics_write, fmt, buf, size)
            if rc != -_errno.ENOBUFS:
                _check(rc, "kvt_metrics_write")
                return ffi.string(buf, size[0]).decode()

    # Storage mode ------------------------------------------------------

    def register_storage(self, segment_bytes, num_layers=1, segments_per_layer=1):
        """Registers a storage-mode layout (KVT_LAYOUT_STORAGE): the engine
        owns its memory and kvtier is the tiers below it. segment_bytes: one
        int for every segment, or num_layers * segments_per_layer of them
        (layer-major); their sum is one block's bytes. They enter the
        namespace, so two geometries never share records. May block (opens
        and recovers the disk tier)."""
        n = num_layers * segments_per_layer
        sizes = [int(segment_bytes)] * n if np.ndim(segment_bytes) == 0 else [int(b) for b in segment_bytes]
        self.register_layout(num_layers, segments_per_layer, 0, [(0, 0, b) for b in sizes],
                             flags=LAYOUT_STORAGE)

    def register_memory(self, buffer, kind=MEM_HOST, nbytes=None):
        """Registers engine memory as a region (kvt_register_memory) and returns
        it (an int): a numpy array, memoryview or writable buffer, a torch
        tensor (its data_ptr; kind=MEM_DEVICE for CUDA memory), or an address
        with nbytes. Pieces then name (region, offset, len). Zero-copy: the
        cache keeps the object alive until unregister_memory or close.
        kind=MEM_HOST_FIXED pins the pages for io_uring fixed buffers (may
        block while the kernel pins them; the pages must not be unmapped,
        remapped or discarded while registered)."""
        if isinstance(buffer, int):
            if nbytes is None:
                raise ValueError("register_memory: an address needs nbytes")
            addr, size, owner = buffer, nbytes, None
        else:
            addr, size, owner = _address(buffer)
            if nbytes is not None:
                if nbytes > size:
                    raise ValueError("register_memory: %d bytes asked of a %d-byte buffer" % (nbytes, size))
                size = nbytes
        region = ffi.new("kvt_region *")
        _check(self._call(lib.kvt_register_memory, ffi.cast("void *", addr), size, kind, region),
               "kvt_register_memory")
        self._regions[region[0]] = owner
        return region[0]

    def unregister_memory(self, region):
        """Forgets a region (KvtError EBUSY while a job in flight uses it)."""
        _check(self._call(lib.kvt_unregister_memory, region), "kvt_unregister_memory")
        self._regions.pop(region, None)

    def exists(self, keys, parent=None, opaque=False, tiers=False):
        """The longest prefix of keys that a tier holds (kvt_exists), split by
        tier, as a LookupResult; opaque=True: engine keys (keys_from_opaque),
        each standing alone. tiers=True fills .tiers (Tier per key). Blocks
        still being stored do not count. No side effects; never waits on I/O."""
        kp, n, karr = _as_keys(keys)
        pp, parr = self._parent(parent)
        res = ffi.new("kvt_lookup_result *")
        res.size = ffi.sizeof("kvt_lookup_result")
        tob = np.empty(n, dtype=np.uint8) if tiers else None
        tp = ffi.cast("uint8_t *", tob.ctypes.data) if tiers and n else ffi.NULL
        _check(self._call(lib.kvt_exists, pp, kp, n, KEYS_OPAQUE if opaque else 0, res, tp), "kvt_exists")
        return LookupResult(res.n_blocks, res.n_prefix, res.n_device, res.n_host, res.n_disk, tob)

    def touch(self, keys, parent=None, opaque=False):
        """Marks the blocks of keys that kvtier holds as the most recent in
        each tier holding them, last key first (kvt_touch), as owner mode's
        release does: for blocks the engine served from its own memory.
        Chained keys: the cached prefix; opaque=True: every key held.
        Returns how many were touched. Never waits on I/O."""
        kp, n, karr = _as_keys(keys)
        pp, parr = self._parent(parent)
        out = ffi.new("size_t *")
        _check(self._call(lib.kvt_touch, pp, kp, n, KEYS_OPAQUE if opaque else 0, out), "kvt_touch")
        return out[0]

    def _parent(self, parent):
        if parent is None:
            return ffi.NULL, None
        pp, pn, parr = _as_keys(parent)
        if pn != 1:
            raise ValueError("parent: one key expected")
        return pp, parr

    def _batch(self, kind, keys, pieces, parent, tokens, opaque, max_blocks, promote=False):
        kp, n, karr = _as_keys(keys)
        pcs, n_pieces, owners = _as_pieces(pieces, writable=(kind == "get"))
        if n == 0:
            raise ValueError("%s: no keys" % kind)
        if n_pieces == 0 or n_pieces % n:
            raise ValueError("%s: %d pieces for %d blocks (the same number per block expected)"
                             % (kind, n_pieces, n))
        pp, parr = self._parent(parent)
        tp, tarr = _as_tokens(tokens, None if tokens is None else n * self.block_tokens)
        b = ffi.new("kvt_batch *")
        lib.kvt_batch_init(b)
        b.n_blocks, b.keys, b.parent, b.tokens = n, kp, pp, tp
        b.pieces, b.pieces_per_block = pcs, n_pieces // n
        b.max_blocks, b.flags = max_blocks, (KEYS_OPAQUE if opaque else 0) | (GET_PROMOTE if promote else 0)
        job = ffi.new("kvt_job *")
        call = "kvt_put_from" if kind == "put" else "kvt_get_into"
        _check(self._call(lib.kvt_put_from if kind == "put" else lib.kvt_get_into, b, job), call)
        sj = StorageJob(self, job[0], n, kind, owners)
        self._storage_jobs[job[0]] = sj
        return sj

    def put_from(self, keys, pieces, parent=None, tokens=None, opaque=False):
        """Copies the blocks of keys from the engine's memory into kvtier's
        tiers (kvt_put_from) and returns a StorageJob at once; the copies run
        on kvtier's workers. pieces: every block's pieces, block after block
        (kvtier.pieces(...), or a list of buffers / (address, len) /
        (region, offset, len)), the same number per block, adding up to
        block_bytes() each. The memory must stay unchanged until the job is
        over. A key already stored or being stored is skipped (result 1).
        KvtError EAGAIN: every job slot is busy (collect and release some)."""
        return self._batch("put", keys, pieces, parent, tokens, opaque, 0)

    def get_into(self, keys, pieces, parent=None, tokens=None, opaque=False, max_blocks=0, promote=False):
        """Loads the longest cached prefix of keys (at most max_blocks; 0: all)
        into the engine's memory (kvt_get_into); returns a StorageJob at once.
        Per-block results: 0 landed, 1 not loaded, negative: that block's error
        (compute it). tokens: verified against the stored ones. promote=True
        (KVT_GET_PROMOTE): blocks loaded from disk also land in kvtier's host
        tier, for an engine with no host tier of its own above kvtier."""
        return self._batch("get", keys, pieces, parent, tokens, opaque, max_blocks, promote)

    def remove(self, keys):
        """Removes keys from every tier (kvt_remove; blocks used by a job in
        flight are kept); returns how many were removed. May block."""
        kp, n, karr = _as_keys(keys)
        out = ffi.new("size_t *")
        _check(self._call(lib.kvt_remove, kp, n, out), "kvt_remove")
        return out[0]

    def storage_collect(self, max_jobs=64):
        """Finished storage jobs, each reported once, oldest first, as a list
        of (StorageJob, status) (status as StorageJob.poll). Never blocks.
        Release each job once its results are read."""
        max_jobs = int(max_jobs)
        if max_jobs < 1:
            raise ValueError("storage_collect: max_jobs must be at least 1, got %d" % max_jobs)
        found = []
        jobs = ffi.new("kvt_job[]", max_jobs)
        status = ffi.new("int[]", max_jobs)
        n = ffi.new("size_t *")
        while True:
            _check(self._call(lib.kvt_storage_collect, jobs, status, max_jobs, n), "kvt_storage_collect")
            for i in range(n[0]):
                job = self._storage_jobs.get(jobs[i])
                if job is None:  # started through the raw lib: wrap it
                    job = StorageJob(self, jobs[i], 0, "raw", None)
                    self._storage_jobs[jobs[i]] = job
                found.append((job, status[i]))
            if n[0] < max_jobs:
                return found
