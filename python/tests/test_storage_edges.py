"""Misuse of the Python storage surface: each raises a clear
error instead of hanging or writing where it must not."""
import math

import numpy as np
import pytest

import kvtier

SEG = 256
BLOCK = 4 * SEG


@pytest.fixture
def cache():
    c = kvtier.Cache(model_fingerprint="edges@v1", device=kvtier.Device.HOST, host_blocks=16)
    c.register_storage(SEG, num_layers=2, segments_per_layer=2)
    yield c
    c.close()


def stored(c, n=1):
    keys = c.hash_tokens(np.arange(n * c.block_tokens, dtype=np.uint32))
    data = (np.arange(n * BLOCK) % 251 + 1).astype(np.uint8)
    with c.put_from(keys, [data[i * BLOCK:(i + 1) * BLOCK] for i in range(n)]) as job:
        assert job.wait() == 0
    return keys, data


def test_get_into_refuses_read_only_destinations(cache):
    keys, _ = stored(cache)
    dest = bytes(BLOCK)
    with pytest.raises((BufferError, TypeError, ValueError)):
        cache.get_into(keys, [dest])
    with pytest.raises((BufferError, TypeError, ValueError)):
        cache.get_into(keys, [(dest, BLOCK)])
    with pytest.raises((BufferError, TypeError, ValueError)):
        cache.get_into(keys, [memoryview(dest)])
    ro = np.zeros(BLOCK, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        cache.get_into(keys, [ro])
    assert dest == bytes(BLOCK) and not ro.any()
    # put_from still reads read-only sources, and writable destinations still work
    keys2 = cache.hash_tokens(np.arange(cache.block_tokens, dtype=np.uint32) + 7)
    with cache.put_from(keys2, [bytes(range(256)) * 4]) as job:
        assert job.wait() == 0
    out = bytearray(BLOCK)
    with cache.get_into(keys2, [out]) as job:
        assert job.wait() == 0
    assert bytes(out) == bytes(range(256)) * 4


def test_storage_collect_rejects_max_jobs_below_one(cache):
    stored(cache)
    with pytest.raises(ValueError):
        cache.storage_collect(0)  # used to spin forever
    with pytest.raises(ValueError):
        cache.storage_collect(-1)


def test_wait_timeouts(cache):
    keys, _ = stored(cache)
    with cache.get_into(keys, [bytearray(BLOCK)]) as job:
        assert job.wait(math.inf) == 0  # inf = forever, as None
        assert job.wait(1e12) == 0  # beyond int64 nanoseconds: forever
        assert job.wait(-5) == 0
        with pytest.raises(ValueError):
            job.wait(float("nan"))


def test_wait_timeout_of_the_wrong_type(cache):
    keys, _ = stored(cache)
    with cache.get_into(keys, [bytearray(BLOCK)]) as job:
        with pytest.raises(TypeError):
            job.wait("1")


def test_log_handler_is_checked():
    with pytest.raises(TypeError):
        kvtier.set_log_handler("bogus")  # used to be installed, then fail on every message


def test_close_waits_for_calls_in_other_threads():
    # close() while other threads are inside calls must neither free the cache
    # under them (a crash) nor hang; calls made after it raise ValueError.
    import threading

    for _ in range(30):
        c = kvtier.Cache(model_fingerprint="edges-close@v1", device=kvtier.Device.HOST,
                         host_blocks=16)
        c.register_storage(SEG, num_layers=2, segments_per_layer=2)
        keys, data = stored(c)
        ended = []

        def worker(i):
            out = bytearray(BLOCK)
            try:
                while True:
                    if i % 3 == 0:
                        c.exists(keys)
                    elif i % 3 == 1:
                        with c.get_into(keys, [out]) as job:
                            job.wait()
                    else:
                        c.stats()
            except ValueError as e:  # the cache is closed
                ended.append(str(e))
            except Exception as e:  # noqa: BLE001 - anything else is a failure
                ended.append("unexpected %r" % (e,))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        c.close()
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive()
        assert len(ended) == 4 and all("closed" in e for e in ended), ended
