"""Binding overhead per call, 16 blocks: the same operations from Python and
from C (overhead.c, compiled here against the installed package's header and
library), on the same cache shape, best of several rounds each.

    python python/bench/overhead.py [--iters 20000] [--rounds 5]

Operations (16 blocks of 1 KiB, host backend, one copy thread):
  lookup   kvt_lookup of 16 keys, all resident on the device tier
  acquire  kvt_acquire + kvt_commit + kvt_release of 16 device hits
  store    kvt_store(EVICT) + kvt_job_wait + kvt_job_release, then
           kvt_acquire + kvt_request_wait + kvt_commit + kvt_release back from host
Storage mode (16 blocks of 1 KiB of the engine's memory, opaque keys, one piece each):
  exists   kvt_exists of 16 keys, all stored in the host tier
  get      kvt_get_into + kvt_storage_wait + kvt_storage_results + kvt_storage_release
  put      kvt_remove of the 16 keys, then kvt_put_from + wait + results + release
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import kvtier

LAYERS, SEGS, SEG_BYTES, BT, N, SLOTS = 2, 2, 256, 16, 16, 64


def best_us(op, iters, rounds):
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(iters):
            op()
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    return best


def python_side(iters, rounds):
    pool = np.zeros((LAYERS, SEGS, SLOTS, SEG_BYTES), np.uint8)
    with kvtier.Cache(model_fingerprint="overhead-bench", device=kvtier.Device.HOST, copy_threads=1,
                      host_blocks=64, block_tokens=BT) as c:
        c.register_pool(pool)
        keys = c.hash_tokens(np.arange(N * BT, dtype=np.uint32) + 1000)

        def op_lookup():
            c.lookup(keys)

        def op_acquire():
            r = c.acquire(keys)
            r.commit()
            r.release()

        def op_store():
            job = c.store(keys, evict=True)
            job.wait()
            job.release()
            r = c.acquire(keys)
            r.wait()
            r.commit()
            r.release()

        op_acquire()
        out = {"lookup": best_us(op_lookup, iters, rounds),
               "acquire": best_us(op_acquire, iters, rounds),
               "store": best_us(op_store, iters // 10 + 1, rounds)}
    out.update(storage_side(iters, rounds))
    return out


def storage_side(iters, rounds):
    block = LAYERS * SEGS * SEG_BYTES
    src = (np.arange(N * block, dtype=np.uint64) % 251).astype(np.uint8).reshape(N, block)
    dst = np.zeros_like(src)
    with kvtier.Cache(model_fingerprint="overhead-bench-storage", device=kvtier.Device.HOST, copy_threads=1,
                      host_blocks=64, block_tokens=BT) as c:
        c.register_storage(block)
        keys = c.keys_from_opaque([bytes([i + 1]) * 32 for i in range(N)])
        put_pieces = kvtier.pieces(block, addresses=src.ctypes.data + np.arange(N) * block)
        get_pieces = kvtier.pieces(block, addresses=dst.ctypes.data + np.arange(N) * block)

        def run(job):
            job.wait()
            job.results()
            job.release()

        def op_exists():
            c.exists(keys, opaque=True)

        def op_get():
            run(c.get_into(keys, get_pieces, opaque=True))

        def op_put():
            c.remove(keys)
            run(c.put_from(keys, put_pieces, opaque=True))

        run(c.put_from(keys, put_pieces, opaque=True))
        out = {"exists": best_us(op_exists, iters, rounds),
               "get": best_us(op_get, iters // 10 + 1, rounds),
               "put": best_us(op_put, iters // 10 + 1, rounds)}
        if not np.array_equal(src, dst):
            raise SystemExit("storage get: the bytes differ")
        return out


def c_side(iters, rounds):
    lib_dir = os.path.dirname(kvtier.LIBRARY_PATH)
    inc = os.path.join(lib_dir, "include")  # the wheel carries the headers beside the library
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "overhead.c")
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "overhead")
        subprocess.run(["cc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-I", inc, src, "-o", exe,
                        kvtier.LIBRARY_PATH, "-Wl,-rpath," + lib_dir], check=True)
        out = subprocess.run([exe, str(iters), str(rounds)], check=True, capture_output=True, text=True).stdout
    return {name: float(us) for name, us in (line.split() for line in out.splitlines())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    py = python_side(a.iters, a.rounds)
    c = c_side(a.iters, a.rounds)
    print("kvtier %s, %d blocks per call, best of %d rounds (store, get, put: %d iterations a round)"
          % (kvtier.version(), N, a.rounds, a.iters // 10 + 1))
    print("%-9s %12s %12s %14s" % ("call", "C us/call", "Python us", "binding us"))
    for name in ("lookup", "acquire", "store", "exists", "get", "put"):
        print("%-9s %12.2f %12.2f %14.2f" % (name, c[name], py[name], py[name] - c[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
