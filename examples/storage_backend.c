/* Storage mode: an engine that owns its KV memory (a RAM pool of pages and
 * its own allocator) uses kvtier only as the tiers below it. Idle
 * conversations are put into kvtier and their pages freed; when one comes
 * back, new pages are allocated, the cached prefix is got into them, and
 * only the rest is recomputed. Every restored page is checked byte for byte
 * against a fresh "prefill".
 *
 *   storage_backend [dir]   (dir holds the disk tier; default /tmp)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvtier/kvtier.h>

#define BLOCK_TOKENS 16
#define LAYERS 4
#define SEG_BYTES 2048 /* K or V of one layer for one page */
#define PAGE_BYTES (LAYERS * 2 * SEG_BYTES)
#define POOL_PAGES 24 /* the engine's own pool: room for three conversations */
#define CONVS 6
#define CONV_PAGES 8

/* ---- the engine's memory: a pool and a free list ---- */

static char *pool;
static int free_pages[POOL_PAGES], n_free;

static int page_alloc(void) { return n_free ? free_pages[--n_free] : -1; }
static void page_free(int p) { free_pages[n_free++] = p; }

/* The engine's "prefill": KV bytes that depend on the tokens and the page. */
static void prefill(uint32_t conv, int page, char *dst) {
  uint32_t x = conv * 2654435761u + (uint32_t)page * 40503u + 1;
  for (int i = 0; i < PAGE_BYTES; i++) {
    x = x * 1664525u + 1013904223u;
    dst[i] = (char)(x >> 24);
  }
}

typedef struct conv {
  uint32_t tokens[CONV_PAGES * BLOCK_TOKENS];
  kvt_key keys[CONV_PAGES];
  int pages[CONV_PAGES]; /* -1 while offloaded */
} conv;

static conv convs[CONVS];

/* The pieces of each page: K and V of every layer, as an engine with
 * per-layer K/V planes would name them (here inside one page). */
static void pieces_of(const conv *cv, kvt_piece *p) {
  for (int b = 0; b < CONV_PAGES; b++)
    for (int s = 0; s < LAYERS * 2; s++)
      p[b * LAYERS * 2 + s] = (kvt_piece){.ptr = pool + (size_t)cv->pages[b] * PAGE_BYTES + (size_t)s * SEG_BYTES,
                                          .len = SEG_BYTES};
}

static int run_batch(kvt_cache *c, conv *cv, int get, uint32_t *n_ok) {
  kvt_piece p[CONV_PAGES * LAYERS * 2];
  pieces_of(cv, p);
  kvt_batch b;
  kvt_batch_init(&b);
  b.n_blocks = CONV_PAGES;
  b.keys = cv->keys;
  b.tokens = cv->tokens;
  b.pieces = p;
  b.pieces_per_block = LAYERS * 2;
  kvt_job job;
  int rc = get ? kvt_get_into(c, &b, &job) : kvt_put_from(c, &b, &job);
  if (rc != 1) return rc;
  rc = kvt_storage_wait(c, job, -1);
  int32_t res[CONV_PAGES];
  kvt_storage_results(c, job, res, CONV_PAGES, n_ok);
  kvt_storage_release(c, job);
  return rc;
}

static int offload(kvt_cache *c, conv *cv) {
  uint32_t ok = 0;
  int rc = run_batch(c, cv, 0, &ok);
  if (rc) return rc;
  for (int b = 0; b < CONV_PAGES; b++) {
    page_free(cv->pages[b]);
    cv->pages[b] = -1;
  }
  return 0;
}

/* Brings a conversation back: cached prefix from kvtier, the rest prefilled. */
static int restore(kvt_cache *c, uint32_t id, uint32_t *restored) {
  conv *cv = &convs[id];
  for (int b = 0; b < CONV_PAGES; b++)
    if ((cv->pages[b] = page_alloc()) < 0) return -1;
  int rc = run_batch(c, cv, 1, restored);
  if (rc < 0) fprintf(stderr, "some pages failed to load (%s): recomputing them\n", kvt_strerror(rc));
  char want[PAGE_BYTES];
  for (uint32_t b = 0; b < CONV_PAGES; b++) {
    char *page = pool + (size_t)cv->pages[b] * PAGE_BYTES;
    prefill(id, (int)b, want);
    if (b < *restored && memcmp(page, want, PAGE_BYTES) != 0) {
      fprintf(stderr, "conversation %u page %u: restored bytes differ\n", id, b);
      return -1;
    }
    if (b >= *restored) memcpy(page, want, PAGE_BYTES);
  }
  return 0;
}

int main(int argc, char **argv) {
  char path[4096];
  snprintf(path, sizeof path, "%s/storage_backend.kvt", argc > 1 ? argv[1] : "/tmp");
  pool = malloc((size_t)POOL_PAGES * PAGE_BYTES);
  if (!pool) return 1;
  for (int p = POOL_PAGES - 1; p >= 0; p--) page_free(p);

  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "example-engine-v1";
  cfg.block_tokens = BLOCK_TOKENS;
  cfg.host_blocks = 16; /* kvtier's own host tier; the rest spills to disk */
  cfg.disk_path = path;
  cfg.disk_blocks = 64;
  cfg.disk_reset = 1;
  kvt_cache *c = NULL;
  int rc = kvt_open(&cfg, &c);
  kvt_segment seg[LAYERS * 2];
  for (int s = 0; s < LAYERS * 2; s++) seg[s] = (kvt_segment){.bytes = SEG_BYTES};
  kvt_layout layout;
  kvt_layout_init(&layout);
  layout.num_layers = LAYERS;
  layout.segments_per_layer = 2;
  layout.num_slots = 0; /* the engine owns its pages */
  layout.segments = seg;
  layout.flags = KVT_LAYOUT_STORAGE;
  if (rc == 0) rc = kvt_register_layout(c, &layout);
  if (rc) {
    fprintf(stderr, "kvtier: %s %s\n", kvt_strerror(rc), c ? kvt_error_detail(c) : "");
    kvt_close(c);
    return 1;
  }

  /* Serve six conversations through a pool that holds three: each one
   * that goes idle is offloaded to make room for the next. */
  for (uint32_t id = 0; id < CONVS; id++) {
    conv *cv = &convs[id];
    for (int i = 0; i < CONV_PAGES * BLOCK_TOKENS; i++) cv->tokens[i] = id * 7919u + (uint32_t)i;
    size_t n;
    kvt_hash_tokens(c, NULL, cv->tokens, CONV_PAGES * BLOCK_TOKENS, cv->keys, CONV_PAGES, &n);
    if (n_free < CONV_PAGES && (rc = offload(c, &convs[id - 3])) != 0) break;
    for (int b = 0; b < CONV_PAGES; b++) {
      cv->pages[b] = page_alloc();
      prefill(id, b, pool + (size_t)cv->pages[b] * PAGE_BYTES);
    }
  }
  for (uint32_t id = CONVS - 3; rc == 0 && id < CONVS; id++) rc = offload(c, &convs[id]);

  /* Every conversation returns; its cache comes back byte-exact. */
  uint32_t total = 0;
  for (uint32_t id = 0; rc == 0 && id < CONVS; id++) {
    uint32_t restored = 0;
    if ((rc = restore(c, id, &restored)) != 0) break;
    total += restored;
    for (int b = 0; b < CONV_PAGES; b++) page_free(convs[id].pages[b]);
  }
  kvt_lookup_result lr = {.size = sizeof lr};
  kvt_exists(c, NULL, convs[0].keys, CONV_PAGES, 0, &lr, NULL);
  printf("restored %u of %u pages byte-exact (conversation 0 now: %u on host, %u on disk)\n", total,
         CONVS * CONV_PAGES, lr.n_host, lr.n_disk);
  kvt_close(c);
  free(pool);
  remove(path);
  return rc == 0 && total == CONVS * CONV_PAGES ? 0 : 1;
}
