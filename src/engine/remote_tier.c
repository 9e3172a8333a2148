/* The remote tier T3 on the engine's side: connecting (and reconnecting
 * while the server is unreachable), existence probes with a short-lived
 * negative cache, gathering puts into jobs, and the tier's stats. The
 * client (remote/remote.h) owns the network; its threads only post
 * completions (jobs.c), exactly as the disk store's do. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "remote/remote.h"
#include "store/record.h"
#include "util/clock.h"

#define KVT__RNEG_SLOTS 4096u /* negative cache entries (direct mapped) */

typedef struct kvt__rneg {
  kvt_key key;
  int64_t until_ns; /* absent until then; 0: empty */
} kvt__rneg;

/* A URL as it may be logged: the password between "user:" and "@" masked. */
static void masked_url(const char *url, char *out, size_t cap) {
  const char *at = strrchr(url, '@'), *scheme = strstr(url, "://");
  const char *auth = scheme ? scheme + 3 : url;
  const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
  if (!at || at < auth || !colon) {
    snprintf(out, cap, "%s", url);
    return;
  }
  snprintf(out, cap, "%.*s:***%s", (int)(colon - url), url, at);
}

static void fill_cfg(kvt_cache *c, kvt__remote_cfg *rc, char *detail, size_t detail_len) {
  memset(rc, 0, sizeof *rc);
  rc->url = c->remote_url;
  rc->user = c->remote_user;
  rc->password = c->remote_password;
  rc->key_prefix = c->remote_prefix;
  rc->ns = c->ns;
  rc->block_tokens = c->bt;
  rc->payload_bytes = c->block_bytes;
  rc->conns_per_node = c->cfg.remote_conns_per_node;
  rc->timeout_ms = c->cfg.remote_timeout_ms;
  rc->detail = detail;
  rc->detail_len = detail_len;
}

/* Retries the connection with backoff until it succeeds or kvt_close. */
static void *reconnect_main(void *arg) {
  kvt_cache *c = arg;
  uint32_t backoff_ms = 100, max_ms = 5000;
  int auth_logged = 0;
  pthread_mutex_lock(&c->rlock);
  while (!c->rthread_stop) {
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += backoff_ms / 1000;
    dl.tv_nsec += (long)(backoff_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    while (!c->rthread_stop && pthread_cond_timedwait(&c->rcond, &c->rlock, &dl) == 0) {
    }
    if (c->rthread_stop) break;
    pthread_mutex_unlock(&c->rlock);
    char why[160] = "";
    kvt__remote_cfg rc;
    fill_cfg(c, &rc, why, sizeof why);
    kvt__remote *r = NULL;
    int rv = kvt__remote_open(&rc, &r);
    /* Log lines go out with no kvtier lock held. */
    if (rv == 0) {
      char url[256];
      masked_url(c->remote_url, url, sizeof url);
      kvt__log_to(&c->log, KVT_LOG_WARN, "remote tier %s reachable: the tier is back", url);
    } else if (rv == KVT_EAUTH && !auth_logged) {
      auth_logged = 1;
      kvt__log_to(&c->log, KVT_LOG_ERROR, "remote tier refused the credentials (%s); retrying", why[0] ? why : kvt_strerror(rv));
    }
    pthread_mutex_lock(&c->rlock);
    if (rv == 0) {
      atomic_store_explicit(&c->remote, r, memory_order_release);
      c->r_reconnects++;
      break;
    }
    backoff_ms = backoff_ms * 2 > max_ms ? max_ms : backoff_ms * 2;
  }
  pthread_mutex_unlock(&c->rlock);
  return NULL;
}

int kvt__rtier_open(kvt_cache *c) {
  c->rput_building = KVT__NONE;
  if (!c->remote_url || c->metadata_only) return 0;
  c->rneg = calloc(KVT__RNEG_SLOTS, sizeof *c->rneg);
  if (!c->rneg) return -ENOMEM;
  pthread_mutex_init(&c->rlock, NULL);
  kvt__cond_init_monotonic(&c->rcond);
  c->rlock_ready = 1;
  c->remote_on = 1;
  char why[160] = "", url[256];
  masked_url(c->remote_url, url, sizeof url);
  kvt__remote_cfg rc;
  fill_cfg(c, &rc, why, sizeof why);
  kvt__remote *r = NULL;
  int rv = kvt__remote_open(&rc, &r);
  if (rv == 0) {
    atomic_store_explicit(&c->remote, r, memory_order_release);
    kvt__log_to(&c->log, KVT_LOG_INFO, "remote tier %s connected", url);
    return 0;
  }
  if (rv != KVT_EREMOTE && rv != KVT_ETIMEDOUT) {
    snprintf(c->detail, sizeof c->detail, "remote tier %.100s: %.120s", url, why[0] ? why : kvt_strerror(rv));
    return rv; /* KVT_EAUTH, a malformed URL, no memory */
  }
  /* Unreachable: a degraded tier (its blocks are misses), not a failed open. */
  kvt__log_to(&c->log, KVT_LOG_WARN, "remote tier %s unreachable (%s): degraded, retrying in the background", url,
              why[0] ? why : kvt_strerror(rv));
  int prc = pthread_create(&c->rthread, NULL, reconnect_main, c);
  if (prc) return -prc;
  c->rthread_running = 1;
  return 0;
}

void kvt__rtier_close(kvt_cache *c) {
  if (c->rthread_running) {
    pthread_mutex_lock(&c->rlock);
    c->rthread_stop = 1;
    pthread_cond_broadcast(&c->rcond);
    pthread_mutex_unlock(&c->rlock);
    pthread_join(c->rthread, NULL);
    c->rthread_running = 0;
  }
  kvt__remote *r = kvt__rtier(c);
  if (r) kvt__remote_close(r);
  atomic_store(&c->remote, NULL);
  if (c->rlock_ready) {
    pthread_mutex_destroy(&c->rlock);
    pthread_cond_destroy(&c->rcond);
    c->rlock_ready = 0;
  }
  free(c->rneg);
  c->rneg = NULL;
}

static kvt__rneg *neg_slot(kvt_cache *c, const kvt_key *k) {
  return &c->rneg[(k->lo ^ (k->hi >> 7)) & (KVT__RNEG_SLOTS - 1)];
}

static uint32_t negative_ms(const kvt_cache *c) {
  return c->cfg.remote_negative_ms ? c->cfg.remote_negative_ms : 1000;
}

void kvt__rtier_absent(kvt_cache *c, const kvt_key *key) {
  if (!c->rneg) return;
  int64_t until = kvt__now_ns() + (int64_t)negative_ms(c) * 1000000;
  pthread_mutex_lock(&c->rlock);
  kvt__rneg *s = neg_slot(c, key);
  s->key = *key;
  s->until_ns = until;
  pthread_mutex_unlock(&c->rlock);
}

static uint32_t probe_chunk(kvt_cache *c, kvt__remote *r, const kvt_key *keys, uint32_t n);

uint32_t kvt__rtier_probe(kvt_cache *c, const kvt_key *keys, size_t n) {
  kvt__remote *r = kvt__rtier(c);
  uint32_t found = 0;
  /* Chunk after chunk while every key of one is there: a long prefix
   * costs a round trip per KVT__RPROBE_MAX blocks. */
  while (r && n > found) {
    size_t left = n - found;
    uint32_t k = left > KVT__RPROBE_MAX ? KVT__RPROBE_MAX : (uint32_t)left;
    uint32_t got = probe_chunk(c, r, keys + found, k);
    found += got;
    if (got < k || found == UINT32_MAX - KVT__RPROBE_MAX) break;
  }
  return found;
}

static uint32_t probe_chunk(kvt_cache *c, kvt__remote *r, const kvt_key *keys, uint32_t n) {
  int64_t now = kvt__now_ns();
  pthread_mutex_lock(&c->rlock);
  const kvt__rneg *s = neg_slot(c, &keys[0]);
  int negative = s->until_ns > now && kvt__key_eq(&s->key, &keys[0]);
  if (negative) c->r_neg_hits++;
  else {
    c->r_probes++;
    c->r_probe_blocks += n;
  }
  pthread_mutex_unlock(&c->rlock);
  if (negative) return 0;
  uint8_t present[KVT__RPROBE_MAX];
  int rc = kvt__remote_exists(r, keys, n, present, 1);
  uint32_t i = 0;
  if (rc > 0)
    while (i < n && present[i] == KVT__RM_PRESENT) i++;
  /* Only the server's own "absent" is remembered: a key not answered (a
   * failing, degraded or slow node, the call's time ran out) is asked
   * again next time. */
  if (rc >= 0 && i < n && present[i] == KVT__RM_ABSENT) {
    kvt__remote_stats rs;
    kvt__remote_get_stats(r, &rs);
    if (rs.nodes_degraded == 0) kvt__rtier_absent(c, &keys[i]);
  }
  return i;
}

uint32_t kvt__rtier_after(kvt_cache *c, const kvt_key *keys, size_t n, uint32_t p) {
  if (!c->remote_on || p >= n) return 0;
  return kvt__rtier_probe(c, keys + p, n - p);
}

/* RPUT jobs in flight at most: a quarter of the pool, so that the
 * transfers requests wait for always find jobs. */
static uint32_t rput_cap(const kvt_cache *c) { return c->cfg.max_jobs / 4 > 1 ? c->cfg.max_jobs / 4 : 1; }

int kvt__rput_add(kvt_cache *c, uint32_t e, int evict) {
  if (!kvt__rtier(c)) return 0;
  uint32_t j = c->rput_building;
  if (j != KVT__NONE && c->jobs[j].n_ops == c->cfg.max_job_blocks) {
    kvt__rput_flush(c);
    j = c->rput_building;
  }
  /* Puts are best effort: with every put job busy and the next one full
   * (a slow server), a block leaving the host is not put (counted). */
  if (j != KVT__NONE && c->jobs[j].n_ops == c->cfg.max_job_blocks) {
    c->st.remote_puts_skipped++;
    return 0;
  }
  if (j == KVT__NONE) {
    if ((j = kvt__job_new(c, KVT__JOB_RPUT, 0)) == KVT__NONE) {
      c->st.remote_puts_skipped++;
      return 0;
    }
    c->rput_building = j;
    c->inflight++; /* kvt_drain waits for it from now on, submitted or not */
    c->st.jobs_started++;
  }
  kvt__job *jb = &c->jobs[j];
  kvt__op *op = &jb->ops[jb->n_ops++];
  const kvt__entry *en = kvt__E(c, e);
  memset(op, 0, sizeof *op);
  op->jb = jb;
  op->entry = e;
  op->ref = KVT__NONE;
  for (int t = 0; t < KVT__NTIERS; t++) op->slot[t] = en->slot[t];
  op->remote = 1;
  op->evict = (uint8_t)(evict != 0);
  kvt__index_pin(&c->map, e, KVT__T_HOST);
  if (evict) c->freeing[KVT__T_HOST]++;
  return 1;
}

/* Submits the gathered job, or keeps gathering while the cap of put jobs
 * is in flight: the next one to finish submits it (one round trip then
 * carries what a slow server held up). */
void kvt__rput_flush(kvt_cache *c) {
  uint32_t j = c->rput_building;
  if (j == KVT__NONE || c->rput_jobs >= rput_cap(c)) return;
  c->rput_building = KVT__NONE;
  c->rput_jobs++;
  kvt__queue_submit(c, j);
}

/* ---- completions (c->lock held; a progress step) ---- */

/* A put to the remote is over: the host copy is unpinned and, for an
 * eviction, leaves (whether or not the server took it: the remote is a
 * cache, and a failing one must not stall the host's eviction). */
void kvt__rput_done(kvt_cache *c, kvt__op *op) {
  uint32_t e = op->entry;
  kvt__index_unpin(&c->map, e, KVT__T_HOST);
  if (op->status == 0) {
    c->st.blocks_h2remote++;
    c->st.bytes_h2remote += c->block_bytes;
  } else if (op->status == KVT_ENOSPACE) {
    c->st.remote_put_refused++;
  } else if (op->status == KVT_ETIMEDOUT) {
    c->st.remote_timeouts++;
  } else if (op->status != KVT_ECANCELED) {
    c->st.remote_errors++;
    kvt__event_note(c, KVT__EV_REMOTE, op->status, UINT64_MAX);
  }
  if (op->evict) {
    kvt__entry *en = kvt__E(c, e);
    c->freeing[KVT__T_HOST]--;
    if (en->pins[KVT__T_HOST] == 0 && en->state[KVT__T_HOST] == KVT__VALID) {
      kvt__drop_tier(c, e, KVT__T_HOST);
      c->st.evictions_host++;
      kvt__maybe_remove(c, e);
    }
  }
}

/* A remote value is trusted only once it is the block the chain asks for:
 * the client checked namespace, key and checksums; the parent is the
 * engine's to check (a record stored under another chain's parent). */
int kvt__rfetch_verify(kvt_cache *c, const kvt__op *op) {
  const kvt__record_hdr *h = kvt__host_slot(&c->host, op->slot[KVT__T_HOST]);
  return kvt__key_eq(&h->parent, &kvt__E(c, op->entry)->parent) ? 0 : KVT_EMISMATCH;
}

void kvt__rtier_fetch_failed(kvt_cache *c, const kvt_key *key, int status) {
  if (status == KVT_ECANCELED) return;
  if (status == KVT_EMISS) {
    c->st.remote_misses++;
    kvt__rtier_absent(c, key);
  } else if (status == KVT_ECORRUPT || status == KVT_EMISMATCH) {
    c->st.remote_corrupt++;
  } else if (status == KVT_ETIMEDOUT) {
    c->st.remote_timeouts++;
  } else {
    c->st.remote_errors++;
    kvt__event_note(c, KVT__EV_REMOTE, status, UINT64_MAX);
  }
}

void kvt__rtier_stats(kvt_cache *c, kvt_stats *st) {
  if (!c->remote_on) return;
  pthread_mutex_lock(&c->rlock);
  st->remote_probes = c->r_probes;
  st->remote_probe_blocks = c->r_probe_blocks;
  st->remote_negative_hits = c->r_neg_hits;
  st->remote_reconnects = c->r_reconnects;
  pthread_mutex_unlock(&c->rlock);
  kvt__remote *r = kvt__rtier(c);
  if (!r) {
    st->remote_degraded = 1;
    return;
  }
  kvt__remote_stats rs;
  kvt__remote_get_stats(r, &rs);
  st->remote_nodes = rs.nodes;
  st->remote_reconnects += rs.recoveries; /* nodes that failed mid-run and answer again */
  st->remote_nodes_degraded = rs.nodes_degraded;
  st->remote_degraded = rs.nodes_degraded > 0;
  st->remote_cluster = (uint32_t)rs.cluster;
}
