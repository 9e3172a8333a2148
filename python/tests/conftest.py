import numpy as np
import pytest

import kvtier

LAYERS, SEGS, SEG_BYTES, BT = 2, 2, 256, 16
BLOCK_BYTES = LAYERS * SEGS * SEG_BYTES


def block_pattern(block_index, salt=0):
    """What the engine 'computes' for block b: distinct per block, layer and segment."""
    idx = np.arange(LAYERS * SEGS * SEG_BYTES, dtype=np.uint64).reshape(LAYERS, SEGS, SEG_BYTES)
    return ((idx * 7 + block_index * 131 + salt * 17 + 1) % 251).astype(np.uint8)


def fill(pool, slots, first_block=0, salt=0):
    for i, s in enumerate(slots):
        pool[:, :, int(s), :] = block_pattern(first_block + i, salt)


def check(pool, slots, first_block=0, salt=0):
    for i, s in enumerate(slots):
        np.testing.assert_array_equal(pool[:, :, int(s), :], block_pattern(first_block + i, salt),
                                      err_msg="block %d in slot %d" % (first_block + i, s))


@pytest.fixture
def make_cache(tmp_path):
    """Opens caches over a RAM pool shaped (layers, K/V, slots, bytes); closes them after."""
    opened = []

    def make(slots=32, host_blocks=64, disk_blocks=0, pool=None, **cfg):
        if disk_blocks:
            cfg.setdefault("disk_path", str(tmp_path / "kv.cache"))
            cfg.setdefault("disk_reset", 1)
        c = kvtier.Cache(model_fingerprint="pytest-model@v1", device=kvtier.Device.HOST,
                         host_blocks=host_blocks, disk_blocks=disk_blocks, block_tokens=BT,
                         dtype=kvtier.Dtype.F16, **cfg)
        opened.append(c)
        if pool is None:
            pool = np.zeros((LAYERS, SEGS, slots, SEG_BYTES), dtype=np.uint8)
        c.register_pool(pool)
        return c, pool

    yield make
    for c in opened:
        c.close()


def tokens_for(n_blocks, seed=0):
    return (np.arange(n_blocks * BT, dtype=np.uint32) * 13 + 1000 + seed * 100003) % 50000
