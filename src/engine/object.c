/* Objects: an engine's opaque state of any size, filed under the chain key
 * of the last full block it covers and stored as storage-mode blocks
 * ("parts") under keys derived from that key. Built on the public storage
 * calls (split between the storage workers), so tiers, records, checksums,
 * LRU, write policy and recovery are theirs. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/hash.h"
#include "engine/storage.h"
#include "store/record.h"
#include "util/clock.h"
#include "util/fault.h"

#define OBJECT_MAGIC 0x33304a424f54564bull /* "KVTOBJ03" */

/* In part 0's meta area: the object. */
typedef struct object_header {
  uint64_t magic;
  uint64_t bytes;
  uint64_t n_tokens;
  uint64_t tokens_hash; /* XXH3-64 of tokens[0..n_tokens) */
  uint64_t nonce;       /* this put's, in every part's trailer */
  kvt_key key;
  uint32_t parts;
  uint32_t reserved;
} object_header;

/* In every part's meta area, after the header's place: which put and
 * which part it is. Parts whose trailers disagree with the header are not
 * one object (a put racing another under the same key, a part left from
 * an older put). Checking them costs nothing per byte: the bytes
 * themselves are guarded by the disk records' checksums, and host RAM is
 * trusted as it is for blocks. */
typedef struct part_trailer {
  uint64_t nonce;
  uint32_t index;
  uint32_t parts;
} part_trailer;

_Static_assert(sizeof(object_header) == 64, "object header layout");
_Static_assert(sizeof(part_trailer) == 16, "part trailer layout");

#define HEADER_BYTES sizeof(object_header)
#define TRAILER_BYTES sizeof(part_trailer)
#define PAGE ((size_t)KVT_RECORD_ALIGN)
#define MAX_OBJECT_BYTES ((uint64_t)1 << 40)
#define PIECES 4 /* per part: meta, bytes, tail; split to make four */

/* Part i's key: the prefix key and i, as an opaque key of this namespace. */
void kvt__object_part_keys(kvt_cache *c, const kvt_key *key, uint32_t first, uint32_t n, kvt_key *out) {
  for (uint32_t i = 0; i < n; i++) {
    uint64_t in[4] = {key->lo, key->hi, first + i, OBJECT_MAGIC};
    out[i] = kvt__opaque_key(&c->ns, in, sizeof in);
  }
}

static int parts_present(kvt_cache *c, const struct object_header *h, uint32_t *tier);
static void remove_parts(kvt_cache *c, const kvt_key *key, uint32_t parts);

/* A part is [meta | the object's next bytes]: the meta area holds part 0's
 * header and every part's trailer. It is a whole page when parts are
 * whole pages (and not too small for one to spare), so that with a
 * page-aligned buffer every part's bytes are whole pages at page-aligned
 * addresses, which the disk tier reads and writes straight, without a
 * staging copy; else just the header and trailer. */
static size_t meta_bytes(size_t block) {
  return block % PAGE == 0 && block >= 8 * PAGE ? PAGE : HEADER_BYTES + TRAILER_BYTES;
}

/* Parts of block bytes for an object; 0 when a block is too small. */
static uint32_t parts_for(uint64_t bytes, size_t block) {
  size_t meta = meta_bytes(block);
  if (block < meta + 64) return 0;
  uint64_t per = block - meta;
  return (uint32_t)((bytes + per - 1) / per);
}

/* The prefix keys of tokens' full blocks: *keys (malloc'd, n of them). */
static int prefix_keys(kvt_cache *c, const uint32_t *tokens, size_t n_tokens, kvt_key **keys, size_t *n) {
  if (!c || !tokens) return -EINVAL;
  int rc = kvt_hash_tokens(c, NULL, tokens, n_tokens, NULL, 0, n);
  if (rc != -ENOBUFS && rc != 0) return rc;
  if (*n == 0) return -EINVAL;
  if (!(*keys = malloc(*n * sizeof(kvt_key)))) return -ENOMEM;
  rc = kvt_hash_tokens(c, NULL, tokens, n_tokens, *keys, *n, n);
  if (rc) free(*keys);
  return rc;
}

/* A batch's first block that did not land: a get's that was not there is a
 * miss; a put's that was skipped (its key stored or being stored since the
 * put removed it: another call under the same key) is KVT_EAGAIN. */
static int batch_result(kvt_cache *c, kvt_job job, uint32_t n, int get) {
  int32_t *res = malloc(n * sizeof *res);
  uint32_t n_ok = 0;
  int rc = res ? kvt_storage_results(c, job, res, n, &n_ok) : -ENOMEM;
  if (rc == 0 && n_ok < n) rc = res[n_ok] == 1 ? (get ? KVT_EMISS : KVT_EAGAIN) : res[n_ok];
  free(res);
  return rc;
}

/* 1 when a part of keys[0..n) is in the tier map in any state: stored,
 * being stored, or held by a get (a removal leaves those). */
static int parts_held(kvt_cache *c, const kvt_key *keys, uint32_t n) {
  int held = 0;
  pthread_mutex_lock(&c->lock);
  for (uint32_t i = 0; i < n && !held; i++) held = kvt__index_find(&c->map, &keys[i]) != KVT__NONE;
  pthread_mutex_unlock(&c->lock);
  return held;
}

/* Waits for the disk copies in flight of keys[0..n) (a KVT_WRITE_THROUGH
 * spill, or a host victim's): kvtier's own, over soon, they keep a part
 * from kvt_remove, which would leave it stored. */
static void spills_wait(kvt_cache *c, const kvt_key *keys, uint32_t n) {
  kvt__flush_submits(c);
  pthread_mutex_lock(&c->lock);
  for (uint32_t i = 0; i < n; i++) {
    for (;;) {
      uint32_t e = kvt__index_find(&c->map, &keys[i]);
      if (e == KVT__NONE) break;
      const kvt__entry *en = kvt__E(c, e);
      if (en->state[KVT__T_HOST] != KVT__VALID || en->state[KVT__T_DISK] != KVT__FILLING) break;
      kvt__wait(c, NULL);
    }
  }
  pthread_mutex_unlock(&c->lock);
}

enum { MAX_SPLIT = 4 };

/* Jobs for n parts of part_bytes: one a worker, while each has four parts,
 * or fewer if they make 1 MiB (below that, one job's overhead is
 * less than the parallel checks save). So a 2 MiB state in parts of
 * 512 KiB (four to read after the first) is split in two, as its eight
 * parts of 256 KiB are. */
uint32_t kvt__object_jobs(uint32_t n, size_t part_bytes, uint32_t workers) {
  const size_t mib = (size_t)1 << 20;
  uint32_t least = part_bytes < mib / 4 ? 4 : (uint32_t)((mib + part_bytes - 1) / part_bytes);
  uint32_t split = workers < MAX_SPLIT ? workers : MAX_SPLIT;
  if (split > n / least) split = n / least;
  return split ? split : 1;
}

/* Runs opaque-keyed storage batches of n parts (ppb pieces each) and waits:
 * split between the storage workers, which copy (and read) in parallel. */
static int run_parts(kvt_cache *c, int get, const kvt_key *keys, const kvt_piece *pieces, uint32_t n, uint32_t ppb,
                     const uint32_t *tokens) {
  uint32_t split = tokens ? 1 : kvt__object_jobs(n, kvt_block_bytes(c), c->storage ? c->storage->n_workers : MAX_SPLIT);
  kvt_job jobs[MAX_SPLIT];
  uint32_t first[MAX_SPLIT + 1], started = 0;
  int rc = 0;
  for (uint32_t k = 0; k <= split; k++) first[k] = (uint32_t)((uint64_t)n * k / split);
  for (; started < split; started++) {
    kvt_batch b;
    kvt_batch_init(&b);
    b.n_blocks = first[started + 1] - first[started];
    b.keys = keys + first[started];
    b.pieces = pieces + (size_t)first[started] * ppb;
    b.pieces_per_block = ppb;
    b.flags = KVT_KEYS_OPAQUE;
    b.tokens = tokens; /* n * block_tokens ids (one job), or NULL */
    int s = get ? kvt__get_into_part(c, &b, &jobs[started]) : kvt_put_from(c, &b, &jobs[started]);
    if (s != 1) {
      rc = s;
      break;
    }
  }
  for (uint32_t k = 0; k < started; k++) {
    int s = kvt_storage_wait(c, jobs[k], -1);
    if (s == 0) s = batch_result(c, jobs[k], first[k + 1] - first[k], get);
    if (s && !rc) rc = s;
    kvt_storage_release(c, jobs[k]);
  }
  return rc;
}

/* Scratch memory, page-aligned, kept per thread between calls: fresh
 * memory for every call would be faulted in page by page as the disk
 * reads into it, which on a virtual machine costs more than the read's
 * own CPU. Past KEEP_BYTES it is the call's own. */
#define KEEP_BYTES ((size_t)16 << 20)

typedef struct kept_scratch {
  char *mem;
  size_t len;
  int in_use;
} kept_scratch;

static pthread_key_t kept_key;
static pthread_once_t kept_once = PTHREAD_ONCE_INIT;
static int kept_ok;

static void kept_free(void *p) {
  kept_scratch *k = p;
  free(k->mem);
  free(k);
}

static void kept_init(void) { kept_ok = pthread_key_create(&kept_key, kept_free) == 0; }

/* len bytes; *kept: 1 when they are the thread's kept scratch (scratch_put gives them back). */
static char *scratch_get(size_t len, int *kept) {
  *kept = 0;
  pthread_once(&kept_once, kept_init);
  kept_scratch *k = kept_ok && len <= KEEP_BYTES ? pthread_getspecific(kept_key) : NULL;
  if (!k && kept_ok && len <= KEEP_BYTES && (k = calloc(1, sizeof *k)) != NULL && pthread_setspecific(kept_key, k)) {
    free(k);
    k = NULL;
  }
  if (k && !k->in_use) {
    if (k->len < len) {
      free(k->mem);
      k->len = 0;
      if (posix_memalign((void **)&k->mem, PAGE, len)) k->mem = NULL;
      else k->len = len;
    }
    if (k->mem) {
      k->in_use = 1;
      *kept = 1;
      return k->mem;
    }
  }
  void *p = NULL;
  return posix_memalign(&p, PAGE, len) ? NULL : p;
}

static void scratch_put(char *mem, int kept) {
  if (!kept) {
    free(mem);
    return;
  }
  kept_scratch *k = pthread_getspecific(kept_key);
  k->in_use = 0;
}

/* Memory the disk tier may move straight (storage mode's registered
 * regions), registered for one call when that can pay: a region of its
 * own, page-aligned, KVT_MEM_HOST (never pinned as a fixed buffer: that
 * costs about what one call would save). KVT_REGION_NONE when not (the parts go through the
 * storage workers' staging instead). */
static kvt_region straight_region(kvt_cache *c, const void *p, size_t len) {
  kvt_region r = KVT_REGION_NONE;
  if (!c->storage || !c->storage->straight || (uintptr_t)p % PAGE ||
      kvt_register_memory(c, (void *)(uintptr_t)p, len, KVT_MEM_HOST, &r))
    return KVT_REGION_NONE;
  return r;
}

/* The scratch of one put or get: every part's meta area, then the tail
 * (the last part's bytes past its last whole page, then padding). */
typedef struct object_io {
  char *mem, *tail, *buf;
  int kept;
  size_t mem_len, block, meta;
  uint64_t bytes;
  uint32_t parts;
  kvt_region mem_r, buf_r;
  kvt_piece *p;
  kvt_key *keys;
} object_io;

static object_header *io_header(const object_io *io) { return (object_header *)(void *)io->mem; }
static part_trailer *io_trailer(const object_io *io, uint32_t i) {
  return (part_trailer *)(void *)(io->mem + (size_t)i * io->meta + HEADER_BYTES);
}

static int io_alloc(kvt_cache *c, object_io *io, char *buf, uint64_t bytes, size_t block) {
  io->block = block;
  io->meta = meta_bytes(block);
  io->parts = parts_for(bytes, block);
  io->bytes = bytes;
  io->buf = buf;
  io->mem_r = io->buf_r = KVT_REGION_NONE;
  size_t metas = kvt__align_up((size_t)io->parts * io->meta, PAGE);
  io->mem_len = metas + block - io->meta;
  io->mem = io->parts ? scratch_get(io->mem_len, &io->kept) : NULL;
  io->p = malloc((size_t)io->parts * PIECES * sizeof *io->p);
  io->keys = malloc(io->parts * sizeof *io->keys);
  if (!io->mem || !io->p || !io->keys) return -ENOMEM;
  io->tail = io->mem + metas;
  if (io->meta == PAGE) {
    io->mem_r = straight_region(c, io->mem, io->mem_len);
    if (io->mem_r != KVT_REGION_NONE) io->buf_r = straight_region(c, buf, bytes);
  }
  return 0;
}

static void io_free(kvt_cache *c, object_io *io) {
  if (io->buf_r != KVT_REGION_NONE) kvt_unregister_memory(c, io->buf_r);
  if (io->mem_r != KVT_REGION_NONE) kvt_unregister_memory(c, io->mem_r);
  if (io->mem) scratch_put(io->mem, io->kept);
  free(io->p);
  free(io->keys);
}

/* Bytes [off, off + len) of the scratch (in_buf 0) or the caller's buffer. */
static kvt_piece io_piece(const object_io *io, int in_buf, uint64_t off, uint64_t len) {
  kvt_region r = in_buf ? io->buf_r : io->mem_r;
  char *base = in_buf ? io->buf : io->mem;
  if (r == KVT_REGION_NONE) return (kvt_piece){.ptr = base + off, .len = len};
  return (kvt_piece){.region = r, .offset = off, .len = len};
}

/* The last part's bytes past its last whole page, which lie in the tail. */
static uint64_t tail_at(const object_io *io, uint64_t *n) {
  uint64_t per = io->block - io->meta, off = (uint64_t)(io->parts - 1) * per, len = io->bytes - off;
  uint64_t whole = len == per ? len : len & ~(uint64_t)(PAGE - 1);
  *n = len - whole;
  return off + whole;
}

/* Part i's pieces: its meta area, its share of the caller's buffer (whole
 * pages but in a last part that is not full), and the tail. Split, longest
 * first and on page boundaries where they can be, to make PIECES, as every
 * part of a batch has as many. A put writes the whole part, the tail's
 * padding zeros included; a get (part_read) of a last part that is not
 * full reads it only up to the object's last page (kvt__get_into_part:
 * the disk's checksum takes the rest as the zeros the put wrote), so an
 * object costs its own bytes and its parts' meta pages, not a whole last
 * part. */
static void part_pieces(const object_io *io, uint32_t i, kvt_piece *p, int part_read) {
  uint32_t n = 0;
  uint64_t per = io->block - io->meta, off = (uint64_t)i * per;
  uint64_t len = io->bytes - off < per ? io->bytes - off : per;
  uint64_t whole = len == per ? len : len & ~(uint64_t)(PAGE - 1);
  uint64_t tail = per - whole;
  if (part_read && io->meta == PAGE && whole < per) {
    tail = kvt__align_up(len - whole, PAGE);
    /* PIECES pages at least, so that each piece is whole pages (straight). */
    uint64_t pages = 1 + (whole + tail) / PAGE;
    if (pages < PIECES) tail += (PIECES - pages) * PAGE;
  }
  p[n++] = io_piece(io, 0, (uint64_t)i * io->meta, io->meta);
  if (whole) p[n++] = io_piece(io, 1, off, whole);
  if (tail) p[n++] = io_piece(io, 0, (uint64_t)(io->tail - io->mem), tail);
  while (n < PIECES) {
    uint32_t m = 0;
    for (uint32_t k = 1; k < n; k++)
      if (p[k].len > p[m].len) m = k;
    memmove(&p[m + 2], &p[m + 1], (n - m - 1) * sizeof *p);
    uint64_t half = p[m].len / 2 >= PAGE ? p[m].len / 2 & ~(uint64_t)(PAGE - 1) : p[m].len / 2;
    p[m + 1] = p[m];
    if (p[m].region == KVT_REGION_NONE) p[m + 1].ptr = (char *)p[m].ptr + half;
    else p[m + 1].offset += half;
    p[m + 1].len = p[m].len - half;
    p[m].len = half;
    n++;
  }
}

static void object_pieces(object_io *io, int part_read) {
  for (uint32_t i = 0; i < io->parts; i++) part_pieces(io, i, &io->p[(size_t)i * PIECES], part_read);
}

/* Headers of objects this cache put or read from disk, so that finding
 * one again reads nothing (a disk read of part 0 is a worker's round trip
 * and a part's I/O: most of a small object's restore). A set of MEMO_WAYS
 * places per bucket, chosen by the key's low bits; a header that finds its
 * bucket full takes the place of the one found or entered longest ago, so
 * only more than MEMO_WAYS live objects in one bucket forget one. An entry
 * names a header that was whole and checked when it was entered; find
 * still checks that every part is in a tier, and get checks the header it
 * reads against the one find described (another put since is a miss, not
 * a corruption). Guarded by c->lock. Sized to the tiers when the first
 * object call comes: places for four times their blocks (every object has
 * a part at least), a power of two between MEMO_MIN_SLOTS and
 * MEMO_MAX_SLOTS (88 bytes each: 5.5 MiB at most). At a fixed 256 places,
 * one per key, a llama.cpp restore of 480 chunks on the disk tier read
 * 2 MB of part 0s only to find them (0.85-1.07 ms per turn; 960 chunks:
 * 1.9-2.5). */
#define MEMO_WAYS 8u
#define MEMO_MIN_SLOTS 256u
#define MEMO_MAX_SLOTS (1u << 16)

typedef struct memo_entry {
  object_header h;
  uint64_t seq;   /* its part 0 record's, when a reopen found it there; else 0 */
  uint64_t stamp; /* when it was entered or last found (the memo's clock) */
  uint8_t used;
} memo_entry;

/* The part 0 a find last read from disk (its meta area and bytes, as
 * they passed their record's checksum), for the get that follows it: a
 * find in a cache that did not put the object (after a restart) reads
 * part 0 for its header, and the get would read it again, a second round
 * trip to the disk before the rest of the object. The get takes it once,
 * when it names the same object (key and put), and reads the other parts;
 * a put or a remove under the key drops it. */
typedef struct kept_part0 {
  char *mem; /* block bytes, page-aligned */
  object_header h;
  uint8_t used;
} kept_part0;

/* An object put, remove or get in progress, on its caller's stack: a
 * second put of the same key meanwhile is KVT_EAGAIN before it touches a
 * part, and a remove or a get waits for it. Gets share the key with each
 * other (shared claims); a put while one runs is KVT_EAGAIN, a remove
 * waits for it. Two puts that both went on would each find parts of the
 * other's (claimed, or already stored) and the one that gave up would
 * remove the key's parts, the other put's included: that put said it
 * stored its object, and nothing was. A remove in the middle of a put
 * would take the parts written so far, and the put would fail. A get
 * whose reads spanned a put's rewrite of the parts would see parts of two
 * puts, call the object damaged and remove the new put's parts; under its
 * claim, a get that sees that has found real damage. A remove waiting is
 * linked at once, so gets that come meanwhile wait behind it (else gets
 * overlapping on several threads kept a remove waiting for good), and a
 * put while only gets hold the key answers 1 when the object is stored
 * whole, as it would alone. */
typedef struct key_claim {
  kvt_key key;
  int shared;   /* a get's */
  int waiting;  /* a remove's, linked while it waits for the key */
  uint64_t seq; /* removes waiting for one key go in this order */
  struct key_claim *next;
} key_claim;

struct kvt__object_memo {
  kept_part0 p0;
  key_claim *claims; /* puts, removes and gets in progress, removes waiting */
  uint64_t claim_seq;
  uint64_t clock;    /* stamps memo entries */
  uint64_t gen;      /* drops so far (puts, removes, failed gets): see memo_gen */
  uint32_t n_slots;  /* a power of two, MEMO_WAYS per bucket */
  memo_entry e[];
};

static uint32_t memo_slots_for(const kvt_cache *c) {
  uint64_t want = 4 * ((uint64_t)c->cap[KVT__T_HOST] + c->cap[KVT__T_DISK]);
  uint32_t n = MEMO_MIN_SLOTS;
  while (n < want && n < MEMO_MAX_SLOTS) n *= 2;
  return n;
}

/* The memo, made at the first call that needs it; NULL without memory. Lock held. */
static struct kvt__object_memo *memo_make(kvt_cache *c) {
  if (!c->objects) {
    uint32_t n = memo_slots_for(c);
    c->objects = calloc(1, sizeof *c->objects + (size_t)n * sizeof(memo_entry));
    if (c->objects) c->objects->n_slots = n;
  }
  return c->objects;
}

static memo_entry *memo_bucket(const kvt_cache *c, const kvt_key *key) {
  uint32_t buckets = c->objects->n_slots / MEMO_WAYS;
  return (memo_entry *)&c->objects->e[(key->lo & (buckets - 1)) * MEMO_WAYS];
}

/* key's entry, or NULL. Lock held. */
static memo_entry *memo_find(const kvt_cache *c, const kvt_key *key) {
  if (!c->objects) return NULL;
  memo_entry *b = memo_bucket(c, key);
  for (uint32_t w = 0; w < MEMO_WAYS; w++)
    if (b[w].used && kvt__key_eq(&b[w].h.key, key)) return &b[w];
  return NULL;
}

/* The place for key's header: its entry, a free place, else the one of
 * its bucket stamped earliest. NULL without memory. Lock held. */
static memo_entry *memo_place(kvt_cache *c, const kvt_key *key) {
  memo_entry *m = memo_find(c, key);
  if (m || !memo_make(c)) return m;
  memo_entry *b = memo_bucket(c, key);
  m = &b[0];
  for (uint32_t w = 0; w < MEMO_WAYS; w++) {
    if (!b[w].used) return &b[w];
    if (b[w].stamp < m->stamp) m = &b[w];
  }
  return m;
}

size_t kvt__object_memo_bytes(const kvt_cache *c) {
  return c->objects ? sizeof *c->objects + (size_t)c->objects->n_slots * sizeof(memo_entry) : 0;
}

/* Remembers h; with gen (a find's memo_gen), only when no drop came since. */
static void memo_put(kvt_cache *c, const object_header *h, const uint64_t *gen) {
  pthread_mutex_lock(&c->lock);
  memo_entry *m = !gen || (c->objects && c->objects->gen == *gen) ? memo_place(c, &h->key) : NULL;
  if (m) *m = (memo_entry){.h = *h, .stamp = ++c->objects->clock, .used = 1};
  pthread_mutex_unlock(&c->lock);
}

/* A header a reopen found in a part 0 record: the newest of a key wins,
 * as the newest record of a key does. */
static void memo_put_found(kvt_cache *c, const object_header *h, uint64_t seq) {
  pthread_mutex_lock(&c->lock);
  memo_entry *m = memo_place(c, &h->key);
  if (m && !(m->used && kvt__key_eq(&m->h.key, &h->key) && m->seq > seq))
    *m = (memo_entry){.h = *h, .seq = seq, .stamp = ++c->objects->clock, .used = 1};
  pthread_mutex_unlock(&c->lock);
}

static int memo_get(kvt_cache *c, const kvt_key *key, object_header *h) {
  pthread_mutex_lock(&c->lock);
  memo_entry *m = memo_find(c, key);
  if (m) {
    *h = m->h;
    m->stamp = ++c->objects->clock;
  }
  pthread_mutex_unlock(&c->lock);
  return m ? 0 : KVT_EMISS;
}

static void memo_drop(kvt_cache *c, const kvt_key *key) {
  pthread_mutex_lock(&c->lock);
  memo_entry *m = memo_find(c, key);
  if (c->objects) c->objects->gen++;
  if (m) m->used = 0;
  if (c->objects && c->objects->p0.used && kvt__key_eq(&c->objects->p0.h.key, key)) c->objects->p0.used = 0;
  pthread_mutex_unlock(&c->lock);
}

/* A find that reads a header from disk takes no claim: a put or a remove
 * of its key may run between its read and its remembering what it read,
 * which would then be older than what is stored (for an object of one
 * part, a get would even take the kept part 0 for the stored object's).
 * Every drop (puts and removes drop their key first) counts, and a find
 * remembers a header it read only when no drop came since it started
 * reading: 0 when the memo cannot be made. */
static uint64_t memo_gen(kvt_cache *c) {
  pthread_mutex_lock(&c->lock);
  uint64_t g = memo_make(c) ? c->objects->gen : 0;
  pthread_mutex_unlock(&c->lock);
  return g;
}

/* The kept part 0's buffer, detached (the caller owns it) or NULL. Lock held. */
static char *p0_detach(kvt_cache *c) {
  kept_part0 *k = c->objects ? &c->objects->p0 : NULL;
  char *mem = k ? k->mem : NULL;
  if (k) k->mem = NULL, k->used = 0;
  return mem;
}

/* Gives a buffer back (freed when another is there by now). Lock held. */
static void p0_attach(kvt_cache *c, char *mem) {
  kept_part0 *k = c->objects ? &c->objects->p0 : NULL;
  if (k && !k->mem) k->mem = mem;
  else free(mem);
}

/* Keeps part 0 (block bytes at part, its header h checked) for the next
 * get, when no drop came since gen (memo_gen). The bytes are copied with
 * no lock held: the buffer is detached. */
static void p0_keep(kvt_cache *c, const object_header *h, const char *part, size_t block, uint64_t gen) {
  pthread_mutex_lock(&c->lock);
  memo_make(c);
  char *mem = p0_detach(c);
  pthread_mutex_unlock(&c->lock);
  if (!mem && posix_memalign((void **)&mem, PAGE, block)) return;
  memcpy(mem, part, block);
  pthread_mutex_lock(&c->lock);
  kept_part0 *k = c->objects ? &c->objects->p0 : NULL;
  if (k && !k->mem && c->objects->gen == gen) {
    k->mem = mem;
    k->h = *h;
    k->used = 1;
  } else {
    free(mem); /* another find kept its own meanwhile */
  }
  pthread_mutex_unlock(&c->lock);
}

/* Part 0 of the object info names, if a find kept it and it is still in a
 * tier (touched there, as a get touches what it reads): its meta area into
 * the scratch, its bytes into the buffer (and the tail, for an object of
 * one part), copied with no lock held. 1 when taken (and no longer kept),
 * else 0. */
static int p0_take(kvt_cache *c, const kvt_object_info *info, const kvt_key *k0, object_io *io) {
  char *mem = NULL;
  pthread_mutex_lock(&c->lock);
  kept_part0 *k = c->objects ? &c->objects->p0 : NULL;
  uint32_t e = KVT__NONE;
  if (k && k->used && kvt__key_eq(&k->h.key, &info->key) && k->h.bytes == info->bytes &&
      k->h.parts == info->parts && k->h.n_tokens == info->n_tokens)
    e = kvt__index_find(&c->map, k0);
  if (e != KVT__NONE && (kvt__E(c, e)->state[KVT__T_HOST] == KVT__VALID ||
                         kvt__E(c, e)->state[KVT__T_DISK] == KVT__VALID)) {
    kvt__index_touch(&c->map, e, KVT__T_HOST);
    kvt__index_touch(&c->map, e, KVT__T_DISK);
    mem = p0_detach(c);
  }
  pthread_mutex_unlock(&c->lock);
  if (!mem) return 0;
  uint64_t per = io->block - io->meta, len = io->bytes < per ? io->bytes : per;
  uint64_t whole = len == per ? len : len & ~(uint64_t)(PAGE - 1);
  memcpy(io->mem, mem, io->meta);
  memcpy(io->buf, mem + io->meta, whole);
  if (whole < per) memcpy(io->tail, mem + io->meta + whole, per - whole);
  pthread_mutex_lock(&c->lock);
  p0_attach(c, mem);
  pthread_mutex_unlock(&c->lock);
  return 1;
}

/* Part 0 is put with the object's header as its token ids (an opaque
 * part has none of its own): its record's token checksum covers them, and
 * a reopen, which reads every record's header and token ids, remembers the
 * object from them, so that finding it after a restart reads nothing from
 * disk. A header taken here is checked as find's own are: every part must
 * be in a tier, and the get reads part 0 and checks the parts it reads. */
void kvt__object_on_record(void *cache, const kvt__record_hdr *rh, const uint32_t *tokens) {
  kvt_cache *c = cache;
  size_t block = kvt_block_bytes(c);
  if (!tokens || (size_t)rh->token_count * sizeof *tokens < HEADER_BYTES || !block) return;
  object_header h;
  memcpy(&h, tokens, HEADER_BYTES);
  if (h.magic != OBJECT_MAGIC || h.bytes == 0 || h.bytes > MAX_OBJECT_BYTES || h.parts != parts_for(h.bytes, block))
    return;
  kvt_key k0;
  kvt__object_part_keys(c, &h.key, 0, 1, &k0);
  if (kvt__key_eq(&k0, &rh->key)) memo_put_found(c, &h, rh->seq);
}

void kvt__object_memo_free(kvt_cache *c) {
  if (c->objects) free(c->objects->p0.mem);
  free(c->objects);
  c->objects = NULL;
}

/* A value no other put shares, across processes and restarts. */
static uint64_t put_nonce(kvt_cache *c, const kvt_key *key) {
  static _Atomic uint64_t counter;
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  uint64_t in[6] = {key->lo, key->hi, (uint64_t)kvt__now_ns(), (uint64_t)rt.tv_sec * 1000000000u + (uint64_t)rt.tv_nsec,
                    atomic_fetch_add(&counter, 1), (uint64_t)(uintptr_t)c};
  return kvt__xxh3_64(in, sizeof in, c->salt);
}

/* Whether claim p keeps me from its key now: a get is kept out by puts
 * and removes (also a remove waiting), a put or a remove by any call
 * holding the key, and by removes that began waiting before it. */
static int claim_blocks(const key_claim *p, const key_claim *me) {
  if (p == me || !kvt__key_eq(&p->key, &me->key)) return 0;
  if (me->shared) return !p->shared;
  if (p->waiting) return p->seq < me->seq;
  return 1;
}

/* 0 with *me linked in as a call working on key's object (shared: a get,
 * which other gets do not exclude); when another call holds the key,
 * KVT_EAGAIN, or with wait, once it has let go. A call that waits for a
 * key exclusively (a remove) is linked while it waits. */
static int claim_take(kvt_cache *c, const kvt_key *key, key_claim *me, int wait, int shared) {
  int rc = 0;
  pthread_mutex_lock(&c->lock);
  if (!memo_make(c)) {
    rc = -ENOMEM;
  } else {
    *me = (key_claim){.key = *key, .shared = shared, .seq = c->objects->claim_seq++};
    if (wait && !shared) {
      me->waiting = 1;
      me->next = c->objects->claims;
      c->objects->claims = me;
    }
  }
  for (const key_claim *p = c->objects ? c->objects->claims : NULL; p && !rc;) {
    if (!claim_blocks(p, me)) {
      p = p->next;
    } else if (!wait) {
      rc = KVT_EAGAIN;
    } else {
      pthread_cond_wait(&c->cond, &c->lock);
      p = c->objects->claims; /* changed meanwhile */
    }
  }
  if (rc == 0 && me->waiting) {
    me->waiting = 0;
  } else if (rc == 0) {
    me->next = c->objects->claims;
    c->objects->claims = me;
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

static void claim_drop(kvt_cache *c, key_claim *me) {
  pthread_mutex_lock(&c->lock);
  for (key_claim **p = &c->objects->claims; *p; p = &(*p)->next)
    if (*p == me) {
      *p = me->next;
      break;
    }
  pthread_cond_broadcast(&c->cond); /* a remove or a get waiting for it */
  pthread_mutex_unlock(&c->lock);
}

static int object_put(kvt_cache *c, object_header h, const void *data, size_t len);
static int whole_object_stored(kvt_cache *c, const kvt_key *key);

/* 1 when an object is stored whole under h's key, of h's length (every
 * one of its part keys, keys[0..h->parts), in a tier) or another
 * (whole_object_stored), 0 when not, or the error that keeps it from
 * telling. */
static int stored_whole(kvt_cache *c, const object_header *h, const kvt_key *keys) {
  kvt_lookup_result res = {.size = sizeof res};
  int rc = kvt_exists(c, NULL, keys, h->parts, KVT_KEYS_OPAQUE, &res, NULL);
  if (rc) return rc;
  return res.n_prefix == h->parts ? 1 : res.n_prefix > 0 ? whole_object_stored(c, &h->key) : 0;
}

int kvt_object_put(kvt_cache *c, const uint32_t *tokens, size_t n_tokens, const void *data, size_t len) {
  if (!c || !tokens || !data || len == 0 || len > MAX_OBJECT_BYTES) return -EINVAL;
  kvt_key *keys = NULL;
  size_t n_keys = 0;
  int rc = prefix_keys(c, tokens, n_tokens, &keys, &n_keys);
  if (rc) return rc;
  size_t block = kvt_block_bytes(c);
  object_header h = {.magic = OBJECT_MAGIC,
                     .bytes = len,
                     .n_tokens = n_tokens,
                     .tokens_hash = kvt__xxh3_64(tokens, n_tokens * sizeof *tokens, 0),
                     .key = keys[n_keys - 1],
                     .parts = parts_for(len, block)};
  free(keys);
  if (!h.parts) return -EINVAL;
  key_claim me;
  rc = claim_take(c, &h.key, &me, 0, 0);
  if (rc == KVT_EAGAIN && claim_take(c, &h.key, &me, 0, 1) == 0) {
    /* Only gets hold the key: kept (1) when stored whole, else not now. */
    kvt_key *pk = malloc(h.parts * sizeof *pk);
    int whole = -ENOMEM;
    if (pk) {
      kvt__object_part_keys(c, &h.key, 0, h.parts, pk);
      whole = stored_whole(c, &h, pk);
      free(pk);
    }
    claim_drop(c, &me);
    return whole > 0 ? 1 : whole < 0 ? whole : KVT_EAGAIN;
  }
  if (rc) return rc;
  rc = object_put(c, h, data, len);
  claim_drop(c, &me);
  return rc;
}

/* kvt_object_put of header h's object, the only put of its key in progress. */
static int object_put(kvt_cache *c, object_header h, const void *data, size_t len) {
  size_t block = kvt_block_bytes(c);
  int rc;
  object_io io = {0};
  if ((rc = io_alloc(c, &io, (char *)(uintptr_t)data, len, block)) != 0) goto out;
  kvt__object_part_keys(c, &h.key, 0, h.parts, io.keys);
  /* An object stored whole under the key, of this length or another: kept.
   * Not known (part 0 unreadable for now): nothing written, that error. */
  int whole = stored_whole(c, &h, io.keys);
  if (whole) {
    rc = whole > 0 ? 1 : whole;
    goto out;
  }
  /* Parts left by an object partly evicted would be skipped by the put. A
   * part the removal leaves is another call's (a get reading it, a block
   * put under a part's key): written now, the object would hold parts of
   * two puts, which every get refuses. So not now: KVT_EAGAIN, nothing
   * written. */
  memo_drop(c, &h.key);
  spills_wait(c, io.keys, h.parts);
  kvt_remove(c, io.keys, h.parts, NULL);
  if (parts_held(c, io.keys, h.parts)) {
    rc = KVT_EAGAIN;
    goto out;
  }
  h.nonce = put_nonce(c, &h.key);
  memset(io.mem, 0, io.mem_len);
  *io_header(&io) = h;
  for (uint32_t i = 0; i < h.parts; i++)
    *io_trailer(&io, i) = (part_trailer){.nonce = h.nonce, .index = i, .parts = h.parts};
  uint64_t tail_len, tail_off = tail_at(&io, &tail_len);
  memcpy(io.tail, (const char *)data + tail_off, tail_len);
  object_pieces(&io, 0);
  /* The header's part last, so that a reader never finds it before the
   * rest. A part skipped (another call claimed its key since the check
   * above) would leave a mix: what this put wrote is removed, KVT_EAGAIN. */
  if (h.parts > 1) rc = run_parts(c, 0, io.keys + 1, io.p + PIECES, h.parts - 1, PIECES, NULL);
  if (rc == 0) {
    uint32_t *t0 = calloc(c->bt, sizeof *t0); /* block_tokens >= 16: the header's 64 bytes fit */
    if (!t0) rc = -ENOMEM;
    else memcpy(t0, &h, HEADER_BYTES), rc = run_parts(c, 0, io.keys, io.p, 1, PIECES, t0);
    free(t0);
  }
  if (rc == KVT_EAGAIN) remove_parts(c, &h.key, h.parts);
  if (rc) goto out;
  /* Parts evicted by the object's own later parts: larger than the tiers. */
  uint32_t tier;
  if (parts_present(c, &h, &tier) == KVT_EMISS) {
    kvt_remove(c, io.keys, h.parts, NULL);
    rc = KVT_ENOSPACE;
  }
  if (rc == 0) memo_put(c, &h, NULL);
out:
  io_free(c, &io);
  return rc;
}

/* Part 0's header and trailer read in place from its host slot, without a
 * job (a worker's wake-up costs more than the 80 bytes): 0, or KVT_EMISS
 * when part 0 is not in the host tier. A valid slot is rewritten only after
 * it has been dropped, under the lock held here. */
static int header_in_host(kvt_cache *c, const kvt_key *k0, object_header *h, part_trailer *t) {
  int rc = KVT_EMISS;
  pthread_mutex_lock(&c->lock);
  uint32_t e = kvt__index_find(&c->map, k0);
  if (e != KVT__NONE && kvt__E(c, e)->state[KVT__T_HOST] == KVT__VALID) {
    const char *p = kvt__record_payload(kvt__host_slot(&c->host, kvt__E(c, e)->slot[KVT__T_HOST]), c->bt);
    memcpy(h, p, HEADER_BYTES);
    memcpy(t, p + HEADER_BYTES, TRAILER_BYTES);
    rc = 0;
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

/* A part's worth of scratch for reading headers from disk (straight when it can). */
typedef struct part_scratch {
  char *mem;
  int kept;
  kvt_region r;
} part_scratch;

static int scratch_open(kvt_cache *c, part_scratch *s) {
  size_t block = kvt_block_bytes(c);
  s->r = KVT_REGION_NONE;
  if (!(s->mem = scratch_get(kvt__align_up(block, PAGE), &s->kept))) return -ENOMEM;
  if (meta_bytes(block) == PAGE) s->r = straight_region(c, s->mem, block);
  return 0;
}

static void scratch_close(kvt_cache *c, part_scratch *s) {
  if (s->r != KVT_REGION_NONE) kvt_unregister_memory(c, s->r);
  if (s->mem) scratch_put(s->mem, s->kept);
}

/* Reads and checks the header of the object filed under key into *h. */
static int read_header(kvt_cache *c, const kvt_key *key, const part_scratch *s, object_header *h) {
  kvt_key k0;
  kvt__object_part_keys(c, key, 0, 1, &k0);
  kvt_lookup_result res = {.size = sizeof res};
  int rc = kvt_exists(c, NULL, &k0, 1, KVT_KEYS_OPAQUE, &res, NULL);
  if (rc) return rc;
  if (res.n_prefix != 1) return KVT_EMISS;
  if (memo_get(c, key, h) == 0) return 0;
  part_trailer t;
  size_t block = kvt_block_bytes(c);
  uint64_t gen = memo_gen(c);
  int from_disk = header_in_host(c, &k0, h, &t) != 0;
  if (from_disk) {
    kvt_piece p = {.ptr = s->mem, .len = block};
    if (s->r != KVT_REGION_NONE) p = (kvt_piece){.region = s->r, .len = block};
    if ((rc = run_parts(c, 1, &k0, &p, 1, 1, NULL)) != 0) return rc;
    memcpy(h, s->mem, HEADER_BYTES);
    memcpy(&t, s->mem + HEADER_BYTES, TRAILER_BYTES);
  }
  if (h->magic != OBJECT_MAGIC || !kvt__key_eq(&h->key, key) || h->bytes == 0 || h->bytes > MAX_OBJECT_BYTES ||
      h->parts != parts_for(h->bytes, block) || t.nonce != h->nonce || t.index != 0 || t.parts != h->parts)
    return KVT_ECORRUPT;
  if (from_disk) {
    int us = kvt__fault_check(KVT_FAULT_OBJECT_KEEP_DELAY_US, 0);
    if (us > 0) usleep((useconds_t)us);
    memo_put(c, h, &gen);
    p0_keep(c, h, s->mem, block, gen);
  }
  return 0;
}

/* Every part in a tier: 0 and the slowest tier in *tier, else KVT_EMISS. */
static int parts_present(kvt_cache *c, const struct object_header *h, uint32_t *tier) {
  kvt_key *pk = malloc(h->parts * sizeof *pk);
  uint8_t *tiers = malloc(h->parts);
  int rc = -ENOMEM;
  if (pk && tiers) {
    kvt__object_part_keys(c, &h->key, 0, h->parts, pk);
    kvt_lookup_result res = {.size = sizeof res};
    rc = kvt_exists(c, NULL, pk, h->parts, KVT_KEYS_OPAQUE, &res, tiers);
    if (rc == 0 && res.n_prefix != h->parts) rc = KVT_EMISS;
    *tier = KVT_TIER_DEVICE;
    for (uint32_t i = 0; rc == 0 && i < h->parts; i++)
      if (tiers[i] > *tier) *tier = tiers[i];
  }
  free(pk);
  free(tiers);
  return rc;
}

/* 1 when the object filed under key is stored whole (its header readable,
 * every part in a tier), as find would have it; 0 when not; or the error
 * that kept it from knowing (reading part 0, memory). */
static int whole_object_stored(kvt_cache *c, const kvt_key *key) {
  part_scratch s;
  if (scratch_open(c, &s)) return -ENOMEM;
  object_header h;
  uint32_t tier;
  int rc = read_header(c, key, &s, &h);
  if (rc == 0) rc = parts_present(c, &h, &tier);
  scratch_close(c, &s);
  /* Not there, or a header that is not whole: not stored (the put's
   * removal clears what is left). Another error: unknown. */
  return rc == 0 ? 1 : rc == KVT_EMISS || rc == KVT_ECORRUPT ? 0 : rc;
}

int kvt_object_find(kvt_cache *c, const uint32_t *tokens, size_t n_tokens, kvt_object_info *info) {
  if (!info || info->size < KVT_OBJECT_INFO_SIZE_V1) return info ? KVT_EVERSION : -EINVAL;
  kvt_key *keys = NULL;
  size_t n_keys = 0;
  int rc = prefix_keys(c, tokens, n_tokens, &keys, &n_keys);
  if (rc) return rc == -EINVAL && c && tokens ? KVT_EMISS : rc;
  part_scratch s;
  rc = scratch_open(c, &s) ? -ENOMEM : KVT_EMISS;
  for (size_t i = n_keys; rc == KVT_EMISS && i-- > 0;) {
    object_header h;
    uint32_t tier;
    int r = read_header(c, &keys[i], &s, &h);
    if (r == 0 && (r = parts_present(c, &h, &tier)) != 0) memo_drop(c, &keys[i]);
    if (r == -ENOMEM || r == -EINVAL) {
      rc = r;
      break;
    }
    if (r) continue;
    uint64_t prefix = (uint64_t)(i + 1) * c->bt;
    uint64_t match = prefix;
    if (h.n_tokens <= n_tokens && kvt__xxh3_64(tokens, h.n_tokens * sizeof *tokens, 0) == h.tokens_hash)
      match = h.n_tokens;
    else if (h.n_tokens < prefix)
      continue; /* a header that does not cover its own key */
    kvt_object_info out = {.size = KVT_OBJECT_INFO_SIZE_V1,
                           .parts = h.parts,
                           .bytes = h.bytes,
                           .n_tokens = h.n_tokens,
                           .match_tokens = match,
                           .key = h.key,
                           .tier = tier};
    memcpy(info, &out, KVT_OBJECT_INFO_SIZE_V1);
    rc = 0;
  }
  scratch_close(c, &s);
  free(keys);
  return rc;
}

static void remove_parts(kvt_cache *c, const kvt_key *key, uint32_t parts) {
  kvt_key *pk = malloc(parts * sizeof *pk);
  if (!pk) return;
  kvt__object_part_keys(c, key, 0, parts, pk);
  memo_drop(c, key);
  spills_wait(c, pk, parts);
  kvt_remove(c, pk, parts, NULL);
  free(pk);
}

/* The caller's first n tokens are the prefix filed under key. */
static int tokens_have_key(kvt_cache *c, const uint32_t *tokens, uint64_t n, const kvt_key *key) {
  kvt_key *keys = NULL;
  size_t n_keys = 0;
  if (n % c->bt || prefix_keys(c, tokens, (size_t)n, &keys, &n_keys)) return 0;
  int same = kvt__key_eq(&keys[n_keys - 1], key);
  free(keys);
  return same;
}

int kvt_object_get(kvt_cache *c, const kvt_object_info *info, const uint32_t *tokens, void *buf, size_t cap) {
  if (!c || !info || !tokens || !buf || info->size < KVT_OBJECT_INFO_SIZE_V1 || !info->parts || !info->bytes)
    return -EINVAL;
  if (cap < info->bytes) return -ENOBUFS;
  size_t block = kvt_block_bytes(c);
  if (!block || info->parts != parts_for(info->bytes, block)) return -EINVAL;
  uint32_t parts = info->parts;
  object_io io = {0};
  key_claim me;
  int rc = claim_take(c, &info->key, &me, 1, 1); /* after a put or remove in progress */
  if (rc) return rc;
  rc = io_alloc(c, &io, buf, info->bytes, block);
  if (rc) goto out;
  kvt__object_part_keys(c, &info->key, 0, parts, io.keys);
  object_pieces(&io, 1);
  /* Part 0 as find read it, when it did (its record checked then): the
   * other parts from the tiers. */
  int kept = p0_take(c, info, &io.keys[0], &io);
again:
  if (kept && parts > 1) rc = run_parts(c, 1, io.keys + 1, io.p + PIECES, parts - 1, PIECES, NULL);
  else if (!kept) rc = run_parts(c, 1, io.keys, io.p, parts, PIECES, NULL);
  if (rc != 0) {
    if (rc == KVT_ECORRUPT) remove_parts(c, &info->key, parts);
    else memo_drop(c, &info->key);
    goto out;
  }
  /* Parts of one put, part 0's header whole: else the object is damaged. */
  const object_header *h = io_header(&io);
  if (h->magic != OBJECT_MAGIC || !kvt__key_eq(&h->key, &info->key) || h->bytes == 0 ||
      h->bytes > MAX_OBJECT_BYTES || h->parts != parts_for(h->bytes, block))
    rc = KVT_ECORRUPT;
  for (uint32_t i = 0; rc == 0 && i < parts && i < h->parts; i++) {
    const part_trailer *t = io_trailer(&io, i);
    if (t->nonce != h->nonce || t->index != i || t->parts != h->parts) rc = KVT_ECORRUPT;
  }
  /* Parts of another put than the kept part 0 (put again since find read
   * it): read part 0 again, as a get that kept nothing. */
  if (rc == KVT_ECORRUPT && kept) {
    kept = 0;
    rc = 0;
    goto again;
  }
  /* A whole object other than the one find described: put since. */
  if (rc == 0 && (h->bytes != info->bytes || h->parts != parts || h->n_tokens != info->n_tokens)) rc = KVT_EMISS;
  if (rc == 0 && (info->match_tokens >= h->n_tokens
                      ? kvt__xxh3_64(tokens, h->n_tokens * sizeof *tokens, 0) != h->tokens_hash
                      : !tokens_have_key(c, tokens, info->match_tokens, &h->key)))
    rc = KVT_EMISMATCH;
  if (rc == 0) {
    uint64_t tail_len, tail_off = tail_at(&io, &tail_len);
    memcpy((char *)buf + tail_off, io.tail, tail_len);
  }
  if (rc == KVT_ECORRUPT) remove_parts(c, &info->key, parts);
  else if (rc) memo_drop(c, &info->key);
out:
  io_free(c, &io);
  claim_drop(c, &me);
  return rc;
}

int kvt_object_remove(kvt_cache *c, const uint32_t *tokens, size_t n_tokens) {
  kvt_key *keys = NULL;
  size_t n_keys = 0;
  int rc = prefix_keys(c, tokens, n_tokens, &keys, &n_keys);
  if (rc) return rc;
  key_claim me;
  if ((rc = claim_take(c, &keys[n_keys - 1], &me, 1, 0)) != 0) {
    free(keys);
    return rc;
  }
  part_scratch s;
  object_header h;
  rc = scratch_open(c, &s) ? -ENOMEM : read_header(c, &keys[n_keys - 1], &s, &h);
  if (rc == 0 || rc == KVT_ECORRUPT) {
    /* A damaged header still names its part 0; the other parts age out. */
    uint32_t parts = rc == 0 ? h.parts : 1;
    remove_parts(c, &keys[n_keys - 1], parts);
    rc = 0;
  }
  scratch_close(c, &s);
  claim_drop(c, &me);
  free(keys);
  return rc;
}
