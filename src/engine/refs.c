/* Request references: fixed-size chunks on a free list.
 *
 * A request's refs are a doubly linked list of chunks of KVT__REF_CHUNK
 * refs; a ref is named by its id, chunk * KVT__REF_CHUNK + offset. Taking
 * and giving back chunks is O(chunks), whatever the number of live refs,
 * and there is no fragmentation: any free chunk serves any request.
 *
 * Capacity: refs are bounded by the device slots only when no two requests
 * share a block; sharers of a cached prefix each hold refs to the same
 * slots. So the pool grows, in slabs, when the live refs of all requests
 * together pass their previous peak, and a request that fits in the free
 * device slots is never refused for lack of reference space. All with
 * c->lock held. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

/* Most chunks ids may name: ref ids stay below 2^32 - 1 (KVT__NONE). */
#define MAX_CHUNKS ((UINT32_MAX / KVT__REF_CHUNK) - 1)

static void slab_link_free(kvt_cache *c, uint32_t slab) {
  kvt__ref_chunk *ch = c->ref_slabs[slab];
  uint32_t first = slab << KVT__SLAB_SHIFT;
  for (uint32_t i = KVT__SLAB_CHUNKS; i-- > 0;) {
    ch[i].next = c->chunk_free;
    ch[i].prev = KVT__NONE;
    c->chunk_free = first + i;
  }
  c->n_chunk_free += KVT__SLAB_CHUNKS;
}

/* One more slab of chunks. -ENOMEM when memory (or the id space) runs out. */
static int refs_grow(kvt_cache *c) {
  if ((uint64_t)(c->n_ref_slabs + 1) * KVT__SLAB_CHUNKS > MAX_CHUNKS) return -ENOMEM;
  if (c->n_ref_slabs == c->ref_slabs_cap) {
    uint32_t cap = c->ref_slabs_cap ? 2 * c->ref_slabs_cap : 8;
    kvt__ref_chunk **s = realloc(c->ref_slabs, sizeof *s * cap);
    if (!s) return -ENOMEM;
    c->ref_slabs = s;
    c->ref_slabs_cap = cap;
  }
  kvt__ref_chunk *slab = malloc(sizeof *slab * KVT__SLAB_CHUNKS);
  if (!slab) return -ENOMEM;
  c->ref_slabs[c->n_ref_slabs] = slab;
  slab_link_free(c, c->n_ref_slabs++);
  return 0;
}

int kvt__refs_init(kvt_cache *c) {
  c->chunk_free = KVT__NONE;
  /* Enough for every device slot held by one request each: growing is
   * then only for requests that share blocks. */
  uint64_t want = (uint64_t)c->cap[KVT__T_DEV] / KVT__REF_CHUNK + 1;
  if (want > 4u * KVT__SLAB_CHUNKS) want = 4u * KVT__SLAB_CHUNKS;
  while ((uint64_t)c->n_ref_slabs * KVT__SLAB_CHUNKS < want) {
    int rc = refs_grow(c);
    if (rc) return rc;
  }
  return 0;
}

void kvt__refs_fini(kvt_cache *c) {
  for (uint32_t i = 0; i < c->n_ref_slabs; i++) free(c->ref_slabs[i]);
  free(c->ref_slabs);
  c->ref_slabs = NULL;
  c->n_ref_slabs = c->ref_slabs_cap = 0;
}

size_t kvt__refs_bytes(const kvt_cache *c) {
  return (size_t)c->n_ref_slabs * KVT__SLAB_CHUNKS * sizeof(kvt__ref_chunk) +
         (size_t)c->ref_slabs_cap * sizeof(kvt__ref_chunk *);
}

int kvt__refs_alloc(kvt_cache *c, uint32_t n, uint32_t *first_chunk, uint32_t *last_chunk) {
  uint32_t need = (n + KVT__REF_CHUNK - 1) / KVT__REF_CHUNK;
  if (need == 0) need = 1;
  while (c->n_chunk_free < need) {
    int rc = refs_grow(c);
    if (rc) return rc;
  }
  uint32_t head = c->chunk_free, prev = KVT__NONE, ch = head;
  for (uint32_t i = 0; i < need; i++) {
    kvt__ref_chunk *k = kvt__chunk(c, ch);
    k->prev = prev;
    prev = ch;
    ch = k->next;
  }
  kvt__chunk(c, prev)->next = KVT__NONE;
  c->chunk_free = ch;
  c->n_chunk_free -= need;
  *first_chunk = head;
  *last_chunk = prev;
  return 0;
}

void kvt__refs_free(kvt_cache *c, uint32_t first_chunk, uint32_t last_chunk, uint32_t n) {
  uint32_t chunks = (n + KVT__REF_CHUNK - 1) / KVT__REF_CHUNK;
  kvt__chunk(c, last_chunk)->next = c->chunk_free;
  c->chunk_free = first_chunk;
  c->n_chunk_free += chunks ? chunks : 1;
}

uint32_t kvt__ref_id(const kvt_cache *c, uint32_t first_chunk, uint32_t i) {
  uint32_t ch = first_chunk;
  for (uint32_t k = i / KVT__REF_CHUNK; k > 0; k--) ch = kvt__chunk(c, ch)->next;
  return ch * KVT__REF_CHUNK + i % KVT__REF_CHUNK;
}
