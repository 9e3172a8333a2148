/* Coalescing of scattered block copies into as few copy runs as possible.
 *
 * A transfer moves n blocks between device slots (each block = one piece per
 * layer and segment, at seg.base + slot * seg.stride) and host payloads (a
 * block's pieces back to back, layer-major, segment-minor). Copy engines pay
 * a few microseconds per copy, so pieces that are contiguous on both sides
 * are merged: K and V of a slot when they are adjacent (FlashInfer), the
 * layers of a cross-layer packed block, consecutive slots whose host
 * payloads are consecutive too.
 *
 * Pure logic: no CUDA, no allocation, no clock. The caller hands in the run
 * buffer; an iterator lets a backend work through any number of blocks with
 * a fixed-size buffer. */
#ifndef KVT_DEV_COALESCE_H
#define KVT_DEV_COALESCE_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier/backend.h"

/* Piece order. Loads go layer by layer so that layer l can be signalled as
 * soon as its runs finish (runs never span two layers); stores go block by
 * block, the host payload's own order, which merges the most.
 *
 * A transfer may be cut into windows of layers (first_layer, n_layers): each
 * window is coalesced on its own, in either order. With BY_BLOCK a block's
 * pieces of the window are contiguous on the host side (and on the device
 * when the layout packs a slot's layers together), so they merge into one
 * run: a backend that copies a load window by window gets long runs and
 * still reports progress a window at a time. */
enum { KVT__ORDER_BY_LAYER = 0, KVT__ORDER_BY_BLOCK = 1 };

/* One copy: bytes from src to dst. `layer` is the layer of its first piece
 * (with KVT__ORDER_BY_LAYER, its only layer). */
typedef struct kvt__copy_run {
  void *dst;
  const void *src;
  size_t bytes;
  uint32_t layer;
} kvt__copy_run;

/* Host memory pinned in separate chunks: a run's host side must not cross a
 * multiple of `chunk` counted from `base`, inside [base, base + len), since
 * the driver only sees one registration per copy. */
typedef struct kvt__host_span {
  uintptr_t base;
  size_t len;
  size_t chunk;
} kvt__host_span;

typedef struct kvt__coalesce_args {
  const kvt_layout *layout; /* segments: device pointers (or RAM for tests) */
  int dir;                  /* KVT_XFER_D2H or KVT_XFER_H2D */
  int order;                /* KVT__ORDER_* */
  uint32_t n_blocks;
  const uint32_t *dev_slots;  /* n_blocks device slots, < layout->num_slots */
  void *const *host_blocks;   /* n_blocks host payloads */
  const kvt__host_span *spans; /* may be NULL */
  uint32_t n_spans;
  uint32_t first_layer, n_layers; /* window [first_layer, first_layer + n_layers);
                                     n_layers 0 = every layer from first_layer */
} kvt__coalesce_args;

/* Cursor over the pieces of a transfer. Fields are private. */
typedef struct kvt__coalesce_iter {
  kvt__coalesce_args a;
  uint32_t layer, block, seg;
  uint32_t step_first, step_end; /* layers [step_first, step_end) visited block
                                    by block: one layer (BY_LAYER), or the window */
  uint32_t end_layer; /* end of the window */
  size_t step_off;  /* offset of `step_first` inside a host payload */
  size_t layer_off; /* offset of `layer` inside a host payload */
  size_t seg_off;   /* offset of `seg` inside its layer */
  size_t piece_off; /* bytes of the current piece already emitted (chunk splits) */
  int finished;
} kvt__coalesce_iter;

/* Validates the arguments (layout with segments, slots in range, host
 * pointers non-NULL, window inside the layout) and positions the cursor on
 * the first piece.
 * Returns 0, -EINVAL or KVT_ELAYOUT. O(n_blocks). */
int kvt__coalesce_begin(kvt__coalesce_iter *it, const kvt__coalesce_args *args);

/* Emits up to max_runs merged runs, starting with the cursor's piece, and
 * advances the cursor. Runs of one call are never merged with those of the
 * previous call. With KVT__ORDER_BY_LAYER a call stops at the end of a
 * layer; *layers_done (may be NULL) receives how many leading layers have
 * all their pieces emitted so far, counting the layers before the window as
 * done (BY_BLOCK: the window's end at the end, else first_layer).
 * Returns the number of runs (0 once everything is emitted). */
size_t kvt__coalesce_next(kvt__coalesce_iter *it, kvt__copy_run *runs, size_t max_runs,
                          uint32_t *layers_done);

/* Runs without any merging or chunk splits: an upper bound for
 * kvt__coalesce when no spans are given (each span boundary crossed by a
 * piece adds one). */
size_t kvt__coalesce_max_runs(const kvt_layout *layout, uint32_t n_blocks);

/* All runs of a transfer (or window) at once. layer_end (layout->num_layers
 * entries, may be NULL): the runs of layers <= l are runs[0, layer_end[l])
 * (BY_LAYER; with BY_BLOCK every entry from first_layer on is *n_runs).
 * Returns 0, -ENOBUFS if max_runs is too small, or the errors of
 * kvt__coalesce_begin. */
int kvt__coalesce(const kvt__coalesce_args *args, kvt__copy_run *runs, size_t max_runs,
                  size_t *n_runs, uint32_t *layer_end);

/* Runs one block needs in `order` after merging inside the block (at slot 0;
 * cross-block merges not counted). The backend's path choice uses
 * block bytes / this as the typical copy size. 0 for a layout without
 * segments. */
size_t kvt__coalesce_runs_per_block(const kvt_layout *layout, int order);

#endif
