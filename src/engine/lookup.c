/* The read path's questions without side effects: lookup (the longest
 * cached prefix by tier, the remote's blocks after the local ones) and the
 * plan built on it. */
#include <errno.h>

#include "core/hash.h"
#include "engine/engine.h"
#include "util/abi.h"

/* The key before keys[i] of a chain that starts the sequence. */
static const kvt_key *parent_of(const kvt_cache *c, const kvt_key *keys, size_t i) {
  return i ? &keys[i - 1] : &c->ns;
}

/* Fastest tier holding a valid copy, or -1. */
static int fastest_valid(const kvt__entry *en) {
  for (int t = 0; t < KVT__NTIERS; t++)
    if (en->state[t] == KVT__VALID) return t;
  return -1;
}

static uint32_t lookup_local(kvt_cache *c, const kvt_key *keys, size_t n, kvt_lookup_result *res, uint8_t *tiers);

/* Lookup under the lock; tiers may be NULL. Returns the prefix length. */
static uint32_t lookup_locked(kvt_cache *c, const kvt_key *keys, size_t n, kvt_lookup_result *res,
                              uint8_t *tiers) {
  uint32_t p = lookup_local(c, keys, n, res, tiers);
  c->st.lookups++;
  c->st.lookup_blocks += n;
  return p;
}

static uint32_t lookup_local(kvt_cache *c, const kvt_key *keys, size_t n, kvt_lookup_result *res,
                             uint8_t *tiers) {
  uint32_t cnt[KVT__NTIERS] = {0, 0, 0}, i = 0;
  kvt__index_prefetch(&c->map, keys, n < 64 ? n : 64);
  for (; i < n; i++) {
    if (i + 64 < n) kvt__index_prefetch_key(&c->map, &keys[i + 64]);
    uint32_t e = kvt__index_find(&c->map, &keys[i]);
    if (e == KVT__NONE) break;
    const kvt__entry *en = kvt__E(c, e);
    int t = fastest_valid(en);
    if (t < 0 || !kvt__key_eq(&en->parent, parent_of(c, keys, i))) break;
    cnt[t]++;
    if (tiers) tiers[i] = (uint8_t)t;
  }
  if (tiers)
    for (size_t k = i; k < n; k++) tiers[k] = KVT_TIER_NONE;
  if (res) {
    res->n_blocks = (uint32_t)n;
    res->n_prefix = i;
    res->n_device = cnt[0];
    res->n_host = cnt[1];
    res->n_disk = cnt[2];
    res->n_remote = 0;
  }
  return i;
}

/* Adds r remote blocks after the local prefix p of a lookup. */
static void add_remote(kvt_lookup_result *res, uint8_t *tiers, uint32_t p, uint32_t r) {
  if (res) {
    res->n_prefix = p + r;
    res->n_remote = r;
  }
  if (tiers)
    for (uint32_t i = p; i < p + r; i++) tiers[i] = KVT_TIER_REMOTE;
}

int kvt_lookup(kvt_cache *c, const kvt_key *keys, size_t n, kvt_lookup_result *res, uint8_t *tier_of_block) {
  KVT__REQ_CHECK(c);
  if ((n && !keys) || !res || n > UINT32_MAX) return -EINVAL;
  if (res->size < KVT_LOOKUP_RESULT_SIZE_V1) return KVT_EVERSION;
  kvt_lookup_result full = {.size = sizeof full};
  pthread_mutex_lock(&c->lock);
  uint32_t p = lookup_locked(c, keys, n, &full, tier_of_block);
  pthread_mutex_unlock(&c->lock);
  add_remote(&full, tier_of_block, p, kvt__rtier_after(c, keys, n, p));
  return kvt__struct_out(res, &full, sizeof full, KVT_LOOKUP_RESULT_SIZE_V1);
}

int kvt_plan_request(kvt_cache *c, const kvt_key *keys, size_t n_blocks, size_t n_tokens, kvt_plan *plan) {
  KVT__REQ_CHECK(c);
  if ((n_blocks && !keys) || !plan) return -EINVAL;
  if (plan->size < KVT_PLAN_SIZE_V1) return KVT_EVERSION;
  if (n_blocks > (size_t)n_tokens / c->bt) return -EINVAL;
  if (n_blocks > c->cfg.max_job_blocks) return -E2BIG;
  pthread_mutex_lock(&c->lock);
  if (!c->have_cost) {
    pthread_mutex_unlock(&c->lock);
    return KVT_ESTATE;
  }
  uint32_t prefix = lookup_locked(c, keys, n_blocks, NULL, c->scratch_tiers);
  if (c->remote_on && prefix < n_blocks) {
    /* The probe is a round trip: not under the lock. The local prefix is
     * read again after it, and the remote blocks count only if it held. */
    pthread_mutex_unlock(&c->lock);
    uint32_t r = kvt__rtier_after(c, keys, n_blocks, prefix);
    pthread_mutex_lock(&c->lock);
    if (lookup_local(c, keys, n_blocks, NULL, c->scratch_tiers) == prefix && c->have_cost) {
      add_remote(NULL, c->scratch_tiers, prefix, r);
      prefix += r;
    } else {
      prefix = lookup_local(c, keys, n_blocks, NULL, c->scratch_tiers);
    }
  }
  kvt_hw_desc hw;
  kvt__calib_hw(&c->calib, &hw);
  kvt_plan full = {.size = sizeof full};
  int rc = kvt_cost_plan(&c->model, &hw, c->bt, n_tokens, prefix, c->scratch_tiers, &full);
  if (rc == 0) KVT__M_PLAN(c, &full);
  pthread_mutex_unlock(&c->lock);
  return rc ? rc : kvt__struct_out(plan, &full, sizeof full, KVT_PLAN_SIZE_V1);
}
