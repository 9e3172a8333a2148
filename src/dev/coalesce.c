#include "dev/coalesce.h"

#include <errno.h>
#include <string.h>

/* Addresses are handled as integers: device pointers are not C objects, and
 * the arithmetic must not depend on what they point to. */

static const kvt_segment *seg_at(const kvt__coalesce_iter *it, uint32_t l, uint32_t s) {
  return &it->a.layout->segments[(size_t)l * it->a.layout->segments_per_layer + s];
}

static int check_args(const kvt__coalesce_args *a) {
  const kvt_layout *lay = a->layout;
  if (!lay || (a->dir != KVT_XFER_D2H && a->dir != KVT_XFER_H2D)) return -EINVAL;
  if (a->order != KVT__ORDER_BY_LAYER && a->order != KVT__ORDER_BY_BLOCK) return -EINVAL;
  if (!lay->segments || lay->num_layers == 0 || lay->segments_per_layer == 0) return KVT_ELAYOUT;
  if (a->n_blocks && (!a->dev_slots || !a->host_blocks)) return -EINVAL;
  if (a->n_spans && !a->spans) return -EINVAL;
  for (uint32_t i = 0; i < a->n_blocks; i++)
    if (a->dev_slots[i] >= lay->num_slots || !a->host_blocks[i]) return -EINVAL;
  for (uint32_t i = 0; i < a->n_spans; i++)
    if (a->spans[i].chunk == 0) return -EINVAL;
  if (a->first_layer >= lay->num_layers || a->n_layers > lay->num_layers - a->first_layer) return -EINVAL;
  return 0;
}

int kvt__coalesce_begin(kvt__coalesce_iter *it, const kvt__coalesce_args *args) {
  if (!it || !args) return -EINVAL;
  int rc = check_args(args);
  if (rc) return rc;
  memset(it, 0, sizeof *it);
  it->a = *args;
  const kvt_layout *lay = args->layout;
  it->end_layer = args->n_layers ? args->first_layer + args->n_layers : lay->num_layers;
  for (uint32_t j = 0; j < args->first_layer * lay->segments_per_layer; j++) it->layer_off += lay->segments[j].bytes;
  it->layer = it->step_first = args->first_layer;
  it->step_off = it->layer_off;
  /* Block order visits the whole window block by block: one step. */
  it->step_end = args->order == KVT__ORDER_BY_BLOCK ? it->end_layer : it->layer + 1;
  it->finished = args->n_blocks == 0;
  return 0;
}

/* Moves the cursor past the current piece: next segment, next layer of the
 * step, the step's layers of the next block, then the next step. Returns 1
 * when a layer ended under BY_LAYER order (the caller stops there). */
static int advance(kvt__coalesce_iter *it) {
  const kvt_layout *lay = it->a.layout;
  it->seg_off += seg_at(it, it->layer, it->seg)->bytes;
  it->piece_off = 0;
  if (++it->seg < lay->segments_per_layer) return 0;
  it->seg = 0;
  it->layer_off += it->seg_off;
  it->seg_off = 0;
  if (++it->layer < it->step_end) return 0;
  if (++it->block < it->a.n_blocks) { /* same step, next block */
    it->layer = it->step_first;
    it->layer_off = it->step_off;
    return 0;
  }
  it->block = 0;
  it->step_first = it->layer;
  it->step_off = it->layer_off; /* every payload has the same shape */
  it->step_end = it->layer + 1; /* only BY_LAYER has a next step */
  if (it->layer == it->end_layer) it->finished = 1;
  return it->a.order == KVT__ORDER_BY_LAYER;
}

/* Where the host side [h, h + len) may extend to without crossing a pinned
 * chunk: returns the allowed length and the chunk's identity. */
static size_t chunk_limit(const kvt__coalesce_args *a, uintptr_t h, size_t len, uint64_t *id) {
  for (uint32_t i = 0; i < a->n_spans; i++) {
    const kvt__host_span *sp = &a->spans[i];
    if (h < sp->base || h - sp->base >= sp->len) continue;
    uint64_t chunk = (h - sp->base) / sp->chunk;
    size_t room = (size_t)(sp->chunk - (h - sp->base) % sp->chunk);
    *id = ((uint64_t)(i + 1) << 48) ^ chunk;
    return len < room ? len : room;
  }
  *id = 0;
  return len;
}

typedef struct piece {
  uintptr_t dst, src;
  size_t bytes;
  uint64_t chunk_id;
} piece;

/* The next part of the cursor's piece: the rest of it, cut at a chunk end. */
static piece current_part(const kvt__coalesce_iter *it) {
  const kvt_segment *sg = seg_at(it, it->layer, it->seg);
  uintptr_t dev = (uintptr_t)sg->base + (uintptr_t)it->a.dev_slots[it->block] * sg->stride;
  uintptr_t host = (uintptr_t)it->a.host_blocks[it->block] + it->layer_off + it->seg_off;
  dev += it->piece_off;
  host += it->piece_off;
  piece p;
  p.bytes = chunk_limit(&it->a, host, sg->bytes - it->piece_off, &p.chunk_id);
  p.dst = it->a.dir == KVT_XFER_D2H ? host : dev;
  p.src = it->a.dir == KVT_XFER_D2H ? dev : host;
  return p;
}

static int extends(const kvt__copy_run *r, uint64_t run_chunk, const piece *p) {
  return (uintptr_t)r->dst + r->bytes == p->dst && (uintptr_t)r->src + r->bytes == p->src &&
         run_chunk == p->chunk_id;
}

static uint32_t layers_done_now(const kvt__coalesce_iter *it) {
  if (it->finished) return it->end_layer;
  return it->a.order == KVT__ORDER_BY_LAYER ? it->step_first : it->a.first_layer;
}

size_t kvt__coalesce_next(kvt__coalesce_iter *it, kvt__copy_run *runs, size_t max_runs,
                          uint32_t *layers_done) {
  size_t k = 0;
  uint64_t run_chunk = 0;
  while (!it->finished) {
    if (seg_at(it, it->layer, it->seg)->bytes == 0) {
      if (advance(it) && k > 0) break;
      continue;
    }
    piece p = current_part(it);
    if (k > 0 && extends(&runs[k - 1], run_chunk, &p)) {
      runs[k - 1].bytes += p.bytes;
    } else {
      if (k == max_runs) break;
      runs[k].dst = (void *)p.dst;
      runs[k].src = (const void *)p.src;
      runs[k].bytes = p.bytes;
      runs[k].layer = it->layer;
      run_chunk = p.chunk_id;
      k++;
    }
    it->piece_off += p.bytes;
    if (it->piece_off == seg_at(it, it->layer, it->seg)->bytes && advance(it)) break;
  }
  if (layers_done) *layers_done = layers_done_now(it);
  return k;
}

size_t kvt__coalesce_max_runs(const kvt_layout *layout, uint32_t n_blocks) {
  if (!layout) return 0;
  return (size_t)n_blocks * layout->num_layers * layout->segments_per_layer;
}

int kvt__coalesce(const kvt__coalesce_args *args, kvt__copy_run *runs, size_t max_runs,
                  size_t *n_runs, uint32_t *layer_end) {
  kvt__coalesce_iter it;
  int rc = kvt__coalesce_begin(&it, args);
  if (rc) return rc;
  if (!n_runs || (max_runs && !runs)) return -EINVAL;
  size_t total = 0;
  uint32_t done = 0, prev = 0, n_layers = args->layout->num_layers;
  for (; layer_end && prev < args->first_layer; prev++) layer_end[prev] = 0; /* before the window */
  prev = args->first_layer;
  while (!it.finished) {
    size_t k = kvt__coalesce_next(&it, runs + total, max_runs - total, &done);
    total += k;
    if (k == 0 && !it.finished) return -ENOBUFS;
    for (; layer_end && prev < done; prev++) layer_end[prev] = (uint32_t)total;
  }
  for (; layer_end && prev < n_layers; prev++) layer_end[prev] = (uint32_t)total;
  *n_runs = total;
  return 0;
}

size_t kvt__coalesce_runs_per_block(const kvt_layout *layout, int order) {
  if (!layout || !layout->segments || layout->num_slots == 0) return 0;
  static const uint32_t slot0 = 0;
  /* Any non-NULL address will do: the host side of one block is contiguous. */
  void *const host[1] = {(void *)(uintptr_t)4096};
  kvt__coalesce_args a = {.layout = layout, .dir = KVT_XFER_H2D, .order = order,
                          .n_blocks = 1, .dev_slots = &slot0, .host_blocks = host};
  kvt__coalesce_iter it;
  if (kvt__coalesce_begin(&it, &a)) return 0;
  size_t n = 0;
  kvt__copy_run r;
  while (kvt__coalesce_next(&it, &r, 1, NULL) == 1) n++;
  return n;
}
