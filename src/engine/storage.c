/* Storage mode: the public calls (regions, exists, put-from, get-into,
 * remove, job results) and what they do to the tier map when a batch is
 * submitted. The copies run in storage_run.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/hash.h"
#include "engine/storage.h"
#include "remote/remote.h"
#include "store/record.h"
#include "util/abi.h"
#include "util/log.h"

#define STORAGE_CHECK(c)                                  \
  do {                                                    \
    if (!(c)) return -EINVAL;                             \
    if (kvt__forked(c)) return KVT_EFORKED;               \
    if (!(c)->layout_ready) return KVT_ELAYOUT;           \
    if (!(c)->storage) return KVT_ESTATE;                 \
  } while (0)

int kvt__storage_layout_ok(kvt_cache *c, const kvt_layout *l) {
  if (l->num_slots != 0 || !l->num_layers || !l->segments_per_layer || !l->segments ||
      (l->flags & KVT_LAYOUT_METADATA_ONLY) || (uint64_t)l->num_layers * l->segments_per_layer > 65536)
    return -EINVAL;
  size_t total = 0;
  for (uint32_t i = 0; i < l->num_layers * l->segments_per_layer; i++) {
    if (!l->segments[i].bytes || l->segments[i].bytes > ((size_t)1 << 30) - total) return -EINVAL;
    total += l->segments[i].bytes;
  }
  return 0;
}

static void storage_free(kvt_cache *c, kvt__storage *s, uint32_t n_jobs) {
  size_t ring = s->ring_bytes;
  /* The disk store forgets fixed buffers before their memory goes (no I/O
   * is in flight by now). */
  for (uint32_t r = 0; c->disk && r < KVT__MAX_REGIONS; r++)
    if (s->regions[r].used && s->regions[r].fixed >= 0) kvt__disk_buf_unregister(c->disk, s->regions[r].fixed);
  for (uint32_t w = 0; c->disk && s->workers && w < s->n_workers; w++)
    if (s->workers[w].prefix_fixed >= 0) kvt__disk_buf_unregister(c->disk, s->workers[w].prefix_fixed);
  if (s->jobs)
    for (uint32_t j = 0; j < n_jobs; j++) {
      free(s->jobs[j].blocks);
      free(s->jobs[j].keys);
      free(s->jobs[j].pieces);
      free(s->jobs[j].tokens);
    }
  if (s->workers)
    for (uint32_t w = 0; w < s->n_workers; w++) {
      if (s->workers[w].stage[0].rec) kvt__host_mem_free(s->workers[w].stage[0].rec, ring);
      free(s->workers[w].straight[0].rec);
      free(s->workers[w].straight[0].iov);
    }
  free(s->jobs);
  free(s->free_jobs);
  free(s->queue);
  free(s->done_q);
  free(s->workers);
  free(s);
}

static int storage_alloc(kvt_cache *c, kvt__storage *s) {
  uint32_t n = c->cfg.max_jobs, m = c->cfg.max_job_blocks;
  s->jobs = calloc(n, sizeof *s->jobs);
  s->free_jobs = calloc(n, sizeof *s->free_jobs);
  s->queue = calloc(n, sizeof *s->queue);
  s->done_q = calloc(n, sizeof *s->done_q);
  if (!s->jobs || !s->free_jobs || !s->queue || !s->done_q) return -ENOMEM;
  (void)m; /* a job's tables grow to its batches (sjob_reserve), not max_job_blocks up front */
  for (uint32_t j = 0; j < n; j++) {
    s->jobs[j].gen = c->salt + j * 0x7f4a7c15u;
    s->free_jobs[s->n_free++] = n - 1 - j;
  }
  if (c->disk) {
    kvt__disk_info di;
    kvt__disk_get_info(c->disk, &di);
    s->straight = di.vectored;
  }
  uint32_t want = c->cfg.copy_threads ? c->cfg.copy_threads : 2;
  s->n_workers = want > 4 ? 4 : want;
  s->workers = calloc(s->n_workers, sizeof *s->workers);
  if (!s->workers) return -ENOMEM;
  for (uint32_t w = 0; w < s->n_workers; w++) s->workers[w].prefix_fixed = -1;
  /* Disk and remote I/O go through each worker's ring of aligned record
   * images, in memory with the host pool's huge-page hint (a staged record
   * is then a few physically contiguous segments for the block device, not
   * one per 4 KiB page). */
  size_t ring = kvt__has_tier(c, KVT__T_DISK) || c->remote_url ? c->record_bytes * KVT__STAGE_DEPTH : 0;
  s->ring_bytes = ring;
  for (uint32_t w = 0; w < s->n_workers; w++) {
    kvt__sworker *wk = &s->workers[w];
    wk->c = c;
    for (uint32_t k = 0; k < KVT__STAGE_DEPTH; k++) {
      wk->stage[k].block = KVT__NONE;
      wk->stage[k].w = wk;
    }
    for (uint32_t k = 0; k < KVT__STRAIGHT_DEPTH; k++) {
      wk->straight[k].block = KVT__NONE;
      wk->straight[k].w = wk;
    }
    if (!ring) continue;
    void *mem = NULL;
    int rc = kvt__host_mem_alloc(ring, &mem);
    if (rc) return rc;
    for (uint32_t k = 0; k < KVT__STAGE_DEPTH; k++) wk->stage[k].rec = (char *)mem + k * c->record_bytes;
    if (!s->straight) continue;
    size_t prefix = kvt__record_prefix_bytes(c->bt);
    void *pre = NULL;
    if (posix_memalign(&pre, KVT_RECORD_ALIGN, prefix * KVT__STRAIGHT_DEPTH) != 0) return -ENOMEM;
    memset(pre, 0, prefix * KVT__STRAIGHT_DEPTH);
    wk->straight[0].rec = pre;
    struct iovec *iov = calloc((size_t)KVT__STRAIGHT_DEPTH * KVT__STRAIGHT_IOV, sizeof *iov);
    if (!iov) return -ENOMEM;
    for (uint32_t k = 0; k < KVT__STRAIGHT_DEPTH; k++) {
      wk->straight[k].rec = (char *)pre + k * prefix;
      wk->straight[k].iov = iov + (size_t)k * KVT__STRAIGHT_IOV;
    }
    /* The prefixes are fixed buffers too, so a record whose pieces lie in
     * registered regions goes all fixed (else it goes vectored). */
    int h = kvt__disk_buf_register(c->disk, pre, prefix * KVT__STRAIGHT_DEPTH);
    wk->prefix_fixed = h < 0 ? -1 : h;
  }
  return 0;
}

int kvt__storage_init(kvt_cache *c) {
  kvt__storage *s = calloc(1, sizeof *s);
  if (!s) return -ENOMEM;
  int rc = storage_alloc(c, s);
  if (rc) {
    storage_free(c, s, c->cfg.max_jobs);
    return rc;
  }
  pthread_cond_init(&s->work, NULL);
  c->storage = s; /* the workers find their tables through it */
  uint32_t started = 0;
  for (; started < s->n_workers; started++) {
    kvt__sworker *wk = &s->workers[started];
    pthread_mutex_init(&wk->lock, NULL);
    pthread_cond_init(&wk->cond, NULL);
    if (pthread_create(&wk->thread, NULL, kvt__storage_worker, wk) != 0) break;
  }
  if (started < s->n_workers) {
    s->n_workers = started + 1; /* the one that failed has its lock to destroy */
    kvt__storage_fini(c);
    return -EAGAIN;
  }
  s->started = 1;
  return 0;
}

void kvt__storage_fini(kvt_cache *c) {
  kvt__storage *s = c->storage;
  if (!s) return;
  pthread_mutex_lock(&c->lock);
  s->stop = 1; /* the workers run what is queued, then exit */
  pthread_cond_broadcast(&s->work);
  pthread_mutex_unlock(&c->lock);
  uint32_t joinable = s->started ? s->n_workers : s->n_workers - 1;
  for (uint32_t w = 0; w < s->n_workers; w++) {
    if (w < joinable) pthread_join(s->workers[w].thread, NULL);
    pthread_mutex_destroy(&s->workers[w].lock);
    pthread_cond_destroy(&s->workers[w].cond);
  }
  pthread_cond_destroy(&s->work);
  kvt_drain(c); /* spills the workers' puts started */
  storage_free(c, s, c->cfg.max_jobs);
  c->storage = NULL;
}

/* ---- regions ---- */

/* The page-aligned part of a host region goes to the disk store as a fixed
 * buffer (pinned once by the kernel, not at every I/O), when the store
 * takes them; -1 when not (too small, no disk tier, the thread pool, the
 * kernel refused: the straight path then uses plain vectored I/O). */
static int region_fixed(kvt_cache *c, char *base, size_t len) {
  if (!c->disk || !c->storage->straight) return -1;
  uintptr_t a = kvt__align_up((uintptr_t)base, KVT_RECORD_ALIGN), b = ((uintptr_t)base + len) & ~(uintptr_t)(KVT_RECORD_ALIGN - 1);
  if (b <= a) return -1;
  int h = kvt__disk_buf_register(c->disk, (void *)a, b - a);
  if (h < 0 && h != KVT_EUNSUPPORTED)
    kvt__log(KVT_LOG_INFO, "storage: region of %zu bytes not registered with io_uring (%s): plain vectored I/O",
             len, kvt_strerror(h));
  return h < 0 ? -1 : h;
}

int kvt_register_memory(kvt_cache *c, void *base, size_t len, int kind, kvt_region *region) {
  STORAGE_CHECK(c);
  if (!base || !len || !region || (kind != KVT_MEM_HOST && kind != KVT_MEM_DEVICE && kind != KVT_MEM_HOST_FIXED) ||
      (uintptr_t)base > UINTPTR_MAX - len)
    return -EINVAL;
  if (kind == KVT_MEM_DEVICE) {
    int rc = kvt__storage_dev_check(base, len);
    if (rc) return rc;
  }
  kvt__storage *s = c->storage;
  pthread_mutex_lock(&c->lock);
  uint32_t slot = KVT__NONE;
  int rc = 0;
  for (uint32_t r = 0; r < KVT__MAX_REGIONS; r++) {
    kvt__region *g = &s->regions[r];
    if (!g->used) {
      if (slot == KVT__NONE) slot = r;
      continue;
    }
    if ((char *)base < g->base + g->len && g->base < (char *)base + len) rc = -EINVAL;
  }
  if (rc == 0 && slot == KVT__NONE) rc = -ENOSPC;
  int fixed = rc == 0 && kind == KVT_MEM_HOST_FIXED;
  if (rc == 0) {
    s->regions[slot] = (kvt__region){.base = base, .len = len, .kind = kind, .used = 1, .busy = (uint8_t)fixed, .fixed = -1};
    *region = slot + 1;
  }
  pthread_mutex_unlock(&c->lock);
  if (!fixed) return rc;
  /* Outside the lock: the kernel pins the region's pages (long for a big
   * one). Meanwhile the region works, with plain vectored I/O. */
  int h = region_fixed(c, base, len);
  pthread_mutex_lock(&c->lock);
  s->regions[slot].fixed = h;
  s->regions[slot].busy = 0;
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int kvt_unregister_memory(kvt_cache *c, kvt_region region) {
  STORAGE_CHECK(c);
  if (region == KVT_REGION_NONE || region > KVT__MAX_REGIONS) return KVT_ENOJOB;
  pthread_mutex_lock(&c->lock);
  kvt__region *g = &c->storage->regions[region - 1];
  int rc = !g->used || g->dying ? KVT_ENOJOB : g->users || g->busy ? KVT_EBUSY : 0;
  int h = rc == 0 ? g->fixed : -1;
  if (rc == 0 && h < 0) g->used = 0;
  if (rc == 0 && h >= 0) g->dying = 1, g->fixed = -1; /* no new job names it */
  pthread_mutex_unlock(&c->lock);
  if (rc || h < 0) return rc;
  /* The disk store waits for I/Os still naming its pages (none once the
   * region's jobs are over: a safety net), then the kernel unpins them. */
  kvt__disk_buf_unregister(c->disk, h);
  pthread_mutex_lock(&c->lock);
  g->dying = 0;
  g->used = 0;
  pthread_mutex_unlock(&c->lock);
  return 0;
}

/* ---- exists ---- */

static int fastest_valid(const kvt__entry *en) {
  for (int t = 0; t < KVT__NTIERS; t++)
    if (en->state[t] == KVT__VALID) return t;
  return -1;
}

/* Longest prefix held by a tier (lock held); tiers may be NULL. */
static uint32_t prefix_locked(kvt_cache *c, const kvt_key *parent, const kvt_key *keys, size_t n, uint32_t flags,
                              uint32_t *cnt, uint8_t *tiers) {
  uint32_t i = 0;
  kvt__index_prefetch(&c->map, keys, n < 32 ? n : 32);
  for (; i < n; i++) {
    if (i + 32 < n) kvt__index_prefetch(&c->map, &keys[i + 32], 1);
    uint32_t e = kvt__index_find(&c->map, &keys[i]);
    if (e == KVT__NONE) break;
    const kvt__entry *en = kvt__E(c, e);
    int t = fastest_valid(en);
    const kvt_key *p = i ? &keys[i - 1] : parent ? parent : &c->ns;
    if (t < 0 || (!(flags & KVT_KEYS_OPAQUE) && !kvt__key_eq(&en->parent, p))) break;
    if (cnt) cnt[t]++;
    if (tiers) tiers[i] = (uint8_t)t;
  }
  if (tiers)
    for (size_t k = i; k < n; k++) tiers[k] = KVT_TIER_NONE;
  return i;
}

int kvt_exists(kvt_cache *c, const kvt_key *parent, const kvt_key *keys, size_t n, uint32_t flags,
               kvt_lookup_result *res, uint8_t *tier_of_block) {
  if (!c) return -EINVAL;
  if (kvt__forked(c)) return KVT_EFORKED;
  if (!c->layout_ready) return KVT_ELAYOUT;
  if ((n && !keys) || !res || n > UINT32_MAX || (flags & ~KVT_KEYS_OPAQUE)) return -EINVAL;
  if (res->size < KVT_LOOKUP_RESULT_SIZE_V1) return KVT_EVERSION;
  uint32_t cnt[KVT__NTIERS] = {0, 0, 0};
  pthread_mutex_lock(&c->lock);
  uint32_t prefix = prefix_locked(c, parent, keys, n, flags, cnt, tier_of_block);
  pthread_mutex_unlock(&c->lock);
  uint32_t r = kvt__rtier_after(c, keys, n, prefix);
  for (uint32_t i = prefix; tier_of_block && i < prefix + r; i++) tier_of_block[i] = KVT_TIER_REMOTE;
  kvt_lookup_result full = {.size = sizeof full, .n_blocks = (uint32_t)n, .n_prefix = prefix + r,
                            .n_device = cnt[0], .n_host = cnt[1], .n_disk = cnt[2], .n_remote = r};
  return kvt__struct_out(res, &full, sizeof full, KVT_LOOKUP_RESULT_SIZE_V1);
}

int kvt_touch(kvt_cache *c, const kvt_key *parent, const kvt_key *keys, size_t n, uint32_t flags,
              size_t *n_touched) {
  if (!c) return -EINVAL;
  if (kvt__forked(c)) return KVT_EFORKED;
  if (!c->layout_ready) return KVT_ELAYOUT;
  if ((n && !keys) || n > UINT32_MAX || (flags & ~KVT_KEYS_OPAQUE)) return -EINVAL;
  size_t done = 0;
  pthread_mutex_lock(&c->lock);
  /* Chained: the prefix ends at the first key not held (or held under
   * another parent); opaque: each key stands alone. */
  uint32_t end = flags & KVT_KEYS_OPAQUE ? (uint32_t)n : prefix_locked(c, parent, keys, n, flags, NULL, NULL);
  for (uint32_t i = end; i-- > 0;) {
    uint32_t e = kvt__index_find(&c->map, &keys[i]);
    if (e == KVT__NONE || fastest_valid(kvt__E(c, e)) < 0) continue;
    for (int t = 0; t < KVT__NTIERS; t++)
      if (kvt__E(c, e)->state[t] == KVT__VALID) kvt__index_touch(&c->map, e, t);
    done++;
  }
  pthread_mutex_unlock(&c->lock);
  if (n_touched) *n_touched = done;
  return 0;
}

/* ---- batches ---- */

void kvt_batch_init(kvt_batch *b) {
  if (!b) return;
  memset(b, 0, sizeof *b);
  b->size = sizeof *b;
  b->pieces_per_block = 1;
}

static kvt_job sjob_handle(const kvt__storage *s, uint32_t j) {
  return ((uint64_t)s->jobs[j].gen << 32) | (j + 1);
}

static uint32_t sjob_from_handle(const kvt_cache *c, kvt_job h) {
  uint32_t j = (uint32_t)h - 1;
  if ((uint32_t)h == 0 || j >= c->cfg.max_jobs) return KVT__NONE;
  const kvt__sjob *jb = &c->storage->jobs[j];
  return jb->busy && jb->user && jb->gen == (uint32_t)(h >> 32) ? j : KVT__NONE;
}

/* Grows a job's tables to the batch (outside the lock: the job is ours). */
static int sjob_reserve(kvt_cache *c, kvt__sjob *jb, size_t n_blocks, size_t n_pieces, size_t n_tokens) {
  _Atomic size_t *counted = &c->storage->job_table_bytes;
  if (n_blocks > jb->blocks_cap) {
    kvt__sblock *b = realloc(jb->blocks, n_blocks * sizeof *b);
    if (!b) return -ENOMEM;
    jb->blocks = b;
    kvt_key *k = realloc(jb->keys, n_blocks * sizeof *k);
    if (!k) return -ENOMEM; /* blocks stays grown: harmless, capacity is not raised */
    jb->keys = k;
    atomic_fetch_add_explicit(counted, (n_blocks - jb->blocks_cap) * (sizeof *b + sizeof *k), memory_order_relaxed);
    jb->blocks_cap = n_blocks;
  }
  if (n_pieces > jb->pieces_cap) {
    kvt__spiece *p = realloc(jb->pieces, n_pieces * sizeof *p);
    if (!p) return -ENOMEM;
    jb->pieces = p;
    atomic_fetch_add_explicit(counted, (n_pieces - jb->pieces_cap) * sizeof *p, memory_order_relaxed);
    jb->pieces_cap = n_pieces;
  }
  if (n_tokens > jb->tokens_cap) {
    uint32_t *t = realloc(jb->tokens, n_tokens * sizeof *t);
    if (!t) return -ENOMEM;
    jb->tokens = t;
    atomic_fetch_add_explicit(counted, (n_tokens - jb->tokens_cap) * sizeof *t, memory_order_relaxed);
    jb->tokens_cap = n_tokens;
  }
  return 0;
}

size_t kvt__storage_metadata_bytes(const kvt_cache *c) {
  const kvt__storage *s = c->storage;
  if (!s) return 0;
  size_t n = c->cfg.max_jobs, b = n * (sizeof(kvt__sjob) + 3 * sizeof(uint32_t));
  b += s->n_workers * sizeof(kvt__sworker);
  if (s->straight && s->ring_bytes) /* each worker's straight iovec tables */
    b += s->n_workers * (size_t)KVT__STRAIGHT_DEPTH * KVT__STRAIGHT_IOV * sizeof(struct iovec);
  return b + atomic_load_explicit(&s->job_table_bytes, memory_order_relaxed);
}

/* Resolves the batch's pieces to addresses (lock held: regions). */
static int resolve_pieces(kvt_cache *c, kvt__sjob *jb, const kvt_batch *b, int part) {
  kvt__storage *s = c->storage;
  jb->regions = 0;
  for (uint32_t i = 0; i < b->n_blocks; i++) {
    uint64_t sum = 0;
    for (uint32_t k = 0; k < b->pieces_per_block; k++) {
      const kvt_piece *p = &b->pieces[(size_t)i * b->pieces_per_block + k];
      kvt__spiece *q = &jb->pieces[(size_t)i * b->pieces_per_block + k];
      if (!p->len || p->len > c->block_bytes || p->reserved) return -EINVAL;
      q->len = p->len;
      q->device = 0;
      q->registered = 0;
      if (p->region == KVT_REGION_NONE) {
        if (!p->ptr) return -EINVAL;
        q->ptr = p->ptr;
      } else {
        if (p->region > KVT__MAX_REGIONS || !s->regions[p->region - 1].used || s->regions[p->region - 1].dying)
          return -EINVAL;
        const kvt__region *g = &s->regions[p->region - 1];
        if (p->offset > g->len || p->len > g->len - p->offset) return -EINVAL;
        q->ptr = g->base + p->offset;
        q->device = g->kind == KVT_MEM_DEVICE;
        q->registered = 1;
        jb->regions |= 1ull << (p->region - 1);
      }
      sum += p->len;
    }
    if (sum != c->block_bytes && !(part && sum < c->block_bytes)) return -EINVAL;
  }
  return 0;
}

static int batch_ok(kvt_cache *c, const kvt_batch *b, kvt_job *job, int kind) {
  if (!b || !job) return -EINVAL;
  if (b->size < KVT_BATCH_SIZE_V1 || b->size > sizeof *b + 4096) return KVT_EVERSION;
  if (!b->n_blocks || !b->keys || !b->pieces || !b->pieces_per_block) return -EINVAL;
  if (b->n_blocks > c->cfg.max_job_blocks) return -E2BIG;
  uint32_t known = KVT_KEYS_OPAQUE | (kind == KVT__SJ_GET ? KVT_GET_PROMOTE : 0);
  if (b->pieces_per_block > 65536 || (b->flags & ~known)) return -EINVAL;
  if (!kvt__has_tier(c, KVT__T_HOST) && !kvt__has_tier(c, KVT__T_DISK)) return KVT_EUNSUPPORTED;
  return 0;
}

static void region_users(kvt__storage *s, uint64_t mask, int delta) {
  for (uint32_t r = 0; mask; r++, mask >>= 1)
    if (mask & 1) s->regions[r].users += delta;
}

/* Claims the put's blocks: a new entry FILLING in the destination tier (its
 * slot comes when the worker makes room), or a skip for a key that exists. */
static void claim_puts(kvt_cache *c, kvt__sjob *jb, const kvt_batch *b) {
  int dest = kvt__has_tier(c, KVT__T_HOST) ? KVT__T_HOST : KVT__T_DISK;
  for (uint32_t i = 0; i < jb->n_blocks; i++) {
    kvt__sblock *sb = &jb->blocks[i];
    sb->entry = KVT__NONE;
    sb->tier = (uint8_t)dest;
    sb->result = 1;
    sb->host_slot = KVT__NONE;
    if (kvt__index_find(&c->map, &b->keys[i]) != KVT__NONE) continue; /* stored or being stored */
    const kvt_key *parent = b->flags & KVT_KEYS_OPAQUE ? &c->ns : i ? &b->keys[i - 1] : b->parent ? b->parent : &c->ns;
    uint32_t e = kvt__index_insert(&c->map, &b->keys[i], parent);
    if (e == KVT__NONE) {
      sb->result = KVT_EAGAIN; /* more blocks being put at once than the map holds */
      continue;
    }
    kvt__index_set_state(&c->map, e, dest, KVT__FILLING, KVT__NONE);
    sb->entry = e;
    sb->result = 0;
  }
}

/* Pins the get's cached prefix in the tier each block is read from; the
 * remote run [rr_from, rr_from + rr_n) (a probe's answer) follows a local
 * prefix that ends at rr_from. */
static void claim_gets(kvt_cache *c, kvt__sjob *jb, const kvt_batch *b, uint32_t rr_from, uint32_t rr_n) {
  uint8_t *tiers = c->scratch_tiers;
  uint32_t prefix = prefix_locked(c, b->parent, b->keys, b->n_blocks, b->flags, NULL, tiers);
  uint32_t local = prefix;
  if (prefix == rr_from) prefix += rr_n; /* else the map changed since the probe: local blocks only */
  if (b->max_blocks && prefix > b->max_blocks) prefix = b->max_blocks;
  for (uint32_t i = 0; i < jb->n_blocks; i++) {
    kvt__sblock *sb = &jb->blocks[i];
    sb->entry = KVT__NONE;
    sb->result = 1;
    sb->tier = KVT_TIER_NONE;
    sb->host_slot = KVT__NONE;
    if (i >= prefix) continue;
    if (i >= local) { /* the remote's: no entry, read by the worker into a staging record */
      sb->tier = KVT__T_REMOTE;
      sb->result = 0;
      continue;
    }
    uint32_t e = kvt__index_find(&c->map, &b->keys[i]);
    sb->entry = e;
    sb->tier = tiers[i];
    sb->result = 0;
    kvt__index_pin(&c->map, e, sb->tier);
  }
}

static int submit(kvt_cache *c, const kvt_batch *user, kvt_job *job, int kind, int part) {
  STORAGE_CHECK(c);
  kvt_batch b;
  kvt_batch_init(&b);
  int rc = batch_ok(c, user, job, kind);
  if (rc) return rc;
  memcpy(&b, user, KVT_BATCH_SIZE_V1 < sizeof b ? KVT_BATCH_SIZE_V1 : sizeof b);
  kvt__storage *s = c->storage;
  uint32_t rr_from = 0, rr_n = 0;
  if (kind == KVT__SJ_GET && c->remote_on) {
    /* The blocks after the local chain: one probe, before the lock. */
    pthread_mutex_lock(&c->lock);
    rr_from = prefix_locked(c, b.parent, b.keys, b.n_blocks, b.flags, NULL, NULL);
    pthread_mutex_unlock(&c->lock);
    rr_n = kvt__rtier_after(c, b.keys, b.n_blocks, rr_from);
  }
  pthread_mutex_lock(&c->lock);
  uint32_t j = s->n_free ? s->free_jobs[--s->n_free] : KVT__NONE;
  if (j != KVT__NONE) s->jobs[j].busy = 1;
  pthread_mutex_unlock(&c->lock);
  if (j == KVT__NONE) return KVT_EAGAIN;
  kvt__sjob *jb = &s->jobs[j];
  size_t n_tok = b.tokens ? (size_t)b.n_blocks * c->bt : 0;
  rc = sjob_reserve(c, jb, b.n_blocks, (size_t)b.n_blocks * b.pieces_per_block, n_tok);
  pthread_mutex_lock(&c->lock);
  if (rc == 0) rc = resolve_pieces(c, jb, &b, part);
  if (rc) {
    jb->busy = 0;
    s->free_jobs[s->n_free++] = j;
    pthread_mutex_unlock(&c->lock);
    return rc;
  }
  jb->gen++;
  jb->kind = (uint8_t)kind;
  jb->done = 0;
  jb->user = 1;
  jb->status = 0;
  jb->n_blocks = b.n_blocks;
  jb->ppb = b.pieces_per_block;
  jb->has_tokens = b.tokens != NULL;
  if (n_tok) memcpy(jb->tokens, b.tokens, n_tok * sizeof(uint32_t));
  memcpy(jb->keys, b.keys, (size_t)b.n_blocks * sizeof(kvt_key));
  jb->opaque = (b.flags & KVT_KEYS_OPAQUE) != 0;
  jb->zero_tail = (uint8_t)part;
  jb->promote = kind == KVT__SJ_GET && !part && (b.flags & KVT_GET_PROMOTE) && kvt__has_tier(c, KVT__T_HOST);
  jb->parent0 = b.parent ? *b.parent : c->ns;
  if (kind == KVT__SJ_PUT) claim_puts(c, jb, &b);
  else claim_gets(c, jb, &b, rr_from, rr_n);
  region_users(s, jb->regions, +1);
  s->queue[(s->q_head + s->q_len++) % c->cfg.max_jobs] = j;
  s->active++;
  pthread_cond_signal(&s->work);
  *job = sjob_handle(s, j);
  pthread_mutex_unlock(&c->lock);
  return 1;
}

int kvt_put_from(kvt_cache *c, const kvt_batch *b, kvt_job *job) { return submit(c, b, job, KVT__SJ_PUT, 0); }

int kvt_get_into(kvt_cache *c, const kvt_batch *b, kvt_job *job) { return submit(c, b, job, KVT__SJ_GET, 0); }

int kvt__get_into_part(kvt_cache *c, const kvt_batch *b, kvt_job *job) { return submit(c, b, job, KVT__SJ_GET, 1); }

/* ---- jobs ---- */

int kvt_storage_wait(kvt_cache *c, kvt_job job, int64_t timeout_ns) {
  STORAGE_CHECK(c);
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  if (timeout_ns > 0) {
    dl.tv_sec += timeout_ns / 1000000000;
    dl.tv_nsec += timeout_ns % 1000000000;
    if (dl.tv_nsec >= 1000000000) {
      dl.tv_sec++;
      dl.tv_nsec -= 1000000000;
    }
  }
  pthread_mutex_lock(&c->lock);
  uint32_t j = sjob_from_handle(c, job);
  int rc = j == KVT__NONE ? KVT_ENOJOB : 0;
  while (rc == 0 && !c->storage->jobs[j].done) {
    if (timeout_ns == 0) rc = 1;
    else if (timeout_ns < 0) pthread_cond_wait(&c->cond, &c->lock);
    else if (pthread_cond_timedwait(&c->cond, &c->lock, &dl) != 0 && !c->storage->jobs[j].done) rc = KVT_ETIMEDOUT;
  }
  if (rc == 0) rc = c->storage->jobs[j].status;
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int kvt_storage_poll(kvt_cache *c, kvt_job job) { return kvt_storage_wait(c, job, 0); }

int kvt_storage_results(kvt_cache *c, kvt_job job, int32_t *results, size_t n, uint32_t *n_ok) {
  STORAGE_CHECK(c);
  if (n && !results) return -EINVAL;
  pthread_mutex_lock(&c->lock);
  uint32_t j = sjob_from_handle(c, job);
  int rc = j == KVT__NONE ? KVT_ENOJOB : 0;
  const kvt__sjob *jb = rc ? NULL : &c->storage->jobs[j];
  if (jb && n > jb->n_blocks) rc = -EINVAL;
  if (jb && rc == 0 && !jb->done) rc = 1;
  if (rc == 0) {
    for (size_t i = 0; i < n; i++) results[i] = jb->blocks[i].result;
    uint32_t ok = 0;
    while (ok < jb->n_blocks && jb->blocks[ok].result == 0) ok++;
    if (n_ok) *n_ok = ok;
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int kvt_storage_collect(kvt_cache *c, kvt_job *jobs, int *status, size_t max, size_t *n) {
  STORAGE_CHECK(c);
  if (!n || (max && !jobs)) return -EINVAL;
  kvt__storage *s = c->storage;
  size_t got = 0;
  pthread_mutex_lock(&c->lock);
  while (got < max && s->d_len) {
    uint32_t j = s->done_q[s->d_head];
    s->d_head = (s->d_head + 1) % c->cfg.max_jobs;
    s->d_len--;
    jobs[got] = sjob_handle(s, j);
    if (status) status[got] = s->jobs[j].status;
    got++;
  }
  pthread_mutex_unlock(&c->lock);
  *n = got;
  return 0;
}

/* Lock held: a finished job leaves the done queue when released. */
static void done_q_drop(kvt_cache *c, uint32_t j) {
  kvt__storage *s = c->storage;
  uint32_t m = c->cfg.max_jobs, w = 0;
  for (uint32_t k = 0; k < s->d_len; k++) {
    uint32_t v = s->done_q[(s->d_head + k) % m];
    if (v != j) s->done_q[(s->d_head + w++) % m] = v;
  }
  s->d_len = w;
}

int kvt_storage_release(kvt_cache *c, kvt_job job) {
  STORAGE_CHECK(c);
  kvt__storage *s = c->storage;
  pthread_mutex_lock(&c->lock);
  uint32_t j = sjob_from_handle(c, job);
  int rc = j == KVT__NONE ? KVT_ENOJOB : 0;
  if (rc == 0) {
    s->jobs[j].user = 0;
    if (s->jobs[j].done) {
      done_q_drop(c, j);
      s->jobs[j].busy = 0;
      s->free_jobs[s->n_free++] = j;
    }
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

/* ---- remove ---- */

int kvt_remove(kvt_cache *c, const kvt_key *keys, size_t n, size_t *n_removed) {
  STORAGE_CHECK(c);
  if (n && !keys) return -EINVAL;
  size_t removed = 0;
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t disk_slot = KVT__NONE;
    int gone = 0;
    pthread_mutex_lock(&c->lock);
    uint32_t e = kvt__index_find(&c->map, &keys[i]);
    if (e != KVT__NONE) {
      kvt__entry *en = kvt__E(c, e);
      int busy = 0;
      for (int t = 0; t < KVT__NTIERS; t++) busy |= en->pins[t] || en->state[t] == KVT__FILLING;
      if (!busy) {
        if (en->state[KVT__T_HOST] == KVT__VALID) kvt__drop_tier(c, e, KVT__T_HOST);
        if (en->state[KVT__T_DISK] == KVT__VALID) {
          /* The slot stays taken until its tombstone is written. */
          disk_slot = en->slot[KVT__T_DISK];
          kvt__index_set_state(&c->map, e, KVT__T_DISK, KVT__ABSENT, 0);
        }
        kvt__maybe_remove(c, e);
        gone = 1;
      }
    }
    pthread_mutex_unlock(&c->lock);
    if (disk_slot != KVT__NONE) {
      int wr = kvt__disk_invalidate(c->disk, disk_slot);
      if (wr && !rc) rc = wr;
      pthread_mutex_lock(&c->lock);
      kvt__slots_put(&c->slots[KVT__T_DISK], disk_slot);
      pthread_cond_broadcast(&c->cond);
      pthread_mutex_unlock(&c->lock);
    }
    removed += gone;
  }
  /* The remote's copies go too (best effort: a degraded node keeps its own). */
  kvt__remote *r = kvt__rtier(c);
  for (size_t i = 0; r && i < n; i += KVT__RPROBE_MAX)
    kvt__remote_remove(r, keys + i, (uint32_t)(n - i < KVT__RPROBE_MAX ? n - i : KVT__RPROBE_MAX));
  if (n_removed) *n_removed = removed;
  return rc;
}
