/* Redis Cluster's slot map, learnt from CLUSTER SLOTS and reloaded by the
 * refresh thread when a redirect or a failure says it is stale (the hash
 * slot of a key: hash_slot.c). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "remote/remote_internal.h"
#include "util/clock.h"

/* The least time between two reloads: a burst of MOVED replies or of failed
 * nodes asks many times, one CLUSTER SLOTS answers them all. */
#define RM_REFRESH_GAP_NS (50 * 1000000LL)

void kvt__rm_want_refresh(kvt__remote *r) {
  if (!r->cluster) return;
  pthread_mutex_lock(&r->refresh_mu);
  r->refresh_wanted = 1;
  pthread_cond_signal(&r->refresh_cv);
  pthread_mutex_unlock(&r->refresh_mu);
}

/* [start, end, [host, port, id...], replicas...]: the master's address. An
 * empty host means "the node you asked". */
static rm_node *range_master(kvt__remote *r, const redisReply *e, const char *asked_host) {
  if (e->type != REDIS_REPLY_ARRAY || e->elements < 3) return NULL;
  const redisReply *m = e->element[2];
  if (m->type != REDIS_REPLY_ARRAY || m->elements < 2) return NULL;
  if (m->element[0]->type != REDIS_REPLY_STRING || m->element[1]->type != REDIS_REPLY_INTEGER) return NULL;
  const char *host = m->element[0]->str;
  if (!host[0] || strcmp(host, "?") == 0) host = asked_host;
  if (strlen(host) >= RM_HOST_MAX) return NULL;
  long long port = m->element[1]->integer;
  if (port <= 0 || port > 65535) return NULL;
  return kvt__rm_node_get(r, host, (int)port);
}

int kvt__rm_apply_slots(kvt__remote *r, const redisReply *rep, const char *asked_host) {
  if (!rep || rep->type != REDIS_REPLY_ARRAY) return -EPROTO;
  uint8_t owned[RM_MAX_NODES] = {0};
  uint16_t *map = calloc(RM_SLOTS, sizeof *map);
  if (!map) return -ENOMEM;
  int rc = 0;
  for (size_t i = 0; i < rep->elements; i++) {
    const redisReply *e = rep->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_INTEGER) {
      rc = -EPROTO;
      break;
    }
    long long lo = e->element[0]->integer, hi = e->element[1]->integer;
    rm_node *n = range_master(r, e, asked_host);
    if (lo < 0 || hi < lo || hi >= (long long)RM_SLOTS || !n) {
      rc = -EPROTO;
      break;
    }
    owned[n->index] = 1;
    for (long long s = lo; s <= hi; s++) map[s] = (uint16_t)(n->index + 1);
  }
  if (rc == 0) {
    for (uint32_t s = 0; s < RM_SLOTS; s++) atomic_store_explicit(&r->slots[s], map[s], memory_order_relaxed);
    uint32_t nn = atomic_load_explicit(&r->nnodes, memory_order_acquire);
    for (uint32_t i = 0; i < nn; i++) atomic_store(&kvt__rm_node_at(r, i)->in_map, owned[i]);
  }
  free(map);
  return rc;
}

/* One reload from the first node that answers: the known masters that are
 * healthy, then the seeds. */
static int refresh_once(kvt__remote *r) {
  char err[128];
  int64_t now = kvt__now_ns();
  uint32_t nn = atomic_load_explicit(&r->nnodes, memory_order_acquire);
  uint32_t tries = nn + r->nseeds;
  for (uint32_t t = 0; t < tries && !atomic_load(&r->stopping); t++) {
    const char *host;
    int port;
    if (t < nn) {
      rm_node *n = kvt__rm_node_at(r, t);
      if (!atomic_load(&n->in_map) || !kvt__rm_node_usable(n, now)) continue;
      host = n->host;
      port = n->port;
    } else {
      host = r->seeds[t - nn];
      port = r->seed_ports[t - nn];
    }
    redisContext *c = NULL;
    if (kvt__rm_connect(r, host, port, &c, err, sizeof err) != 0) continue;
    redisReply *rep = redisCommand(c, "CLUSTER SLOTS");
    int rc = kvt__rm_apply_slots(r, rep, host);
    if (rep) freeReplyObject(rep);
    redisFree(c);
    if (rc == 0) {
      RM_ADD(r, refreshes, 1);
      return 0;
    }
  }
  return KVT_EREMOTE;
}

void *kvt__rm_refresh_main(void *arg) {
  kvt__remote *r = arg;
  int64_t last = 0;
  kvt__rm_sigpipe sp;
  kvt__rm_sigpipe_off(&sp); /* for the thread's life */
  pthread_mutex_lock(&r->refresh_mu);
  while (!atomic_load(&r->stopping)) {
    if (!r->refresh_wanted) {
      pthread_cond_wait(&r->refresh_cv, &r->refresh_mu);
      continue;
    }
    int64_t now = kvt__now_ns();
    if (last && now - last < RM_REFRESH_GAP_NS) {
      int64_t at = last + RM_REFRESH_GAP_NS;
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      int64_t wall = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + (at - now);
      ts.tv_sec = wall / 1000000000;
      ts.tv_nsec = wall % 1000000000;
      pthread_cond_timedwait(&r->refresh_cv, &r->refresh_mu, &ts);
      continue;
    }
    r->refresh_wanted = 0;
    pthread_mutex_unlock(&r->refresh_mu);
    refresh_once(r);
    last = kvt__now_ns();
    pthread_mutex_lock(&r->refresh_mu);
  }
  pthread_mutex_unlock(&r->refresh_mu);
  return NULL;
}
