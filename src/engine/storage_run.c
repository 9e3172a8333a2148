/* Storage mode workers: make room, move bytes between the engine's pieces
 * and record images (or straight between the pieces and the file),
 * commit per-block results (storage.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/storage.h"
#include "remote/remote.h"
#include "store/record.h"

/* ---- bytes ---- */

/* Pieces of block i -> payload (put) or payload -> pieces (get). */
static int copy_pieces(kvt__sjob *jb, uint32_t i, char *payload, int to_engine) {
  const kvt__spiece *p = &jb->pieces[(size_t)i * jb->ppb];
  size_t off = 0;
  for (uint32_t k = 0; k < jb->ppb; off += p[k].len, k++) {
    if (p[k].device) {
      int rc = to_engine ? kvt__storage_dev_copy(p[k].ptr, payload + off, p[k].len, 1)
                         : kvt__storage_dev_copy(payload + off, p[k].ptr, p[k].len, 0);
      if (rc) return rc;
    } else if (to_engine) {
      memcpy(p[k].ptr, payload + off, p[k].len);
    } else {
      memcpy(payload + off, p[k].ptr, p[k].len);
    }
  }
  return 0;
}

/* The iovecs of block i's record moved straight: the prefix, then the
 * block's pieces with adjacent ones merged, written to v when non-NULL.
 * Returns their count, or 0 when the block goes through staging: a piece
 * outside a registered host region, an address or length O_DIRECT would
 * refuse, or more runs than a straight stage holds. */
static uint32_t straight_iov(kvt_cache *c, const kvt__sjob *jb, uint32_t i, void *prefix, struct iovec *v) {
  if (!c->storage->straight) return 0;
  const kvt__spiece *p = &jb->pieces[(size_t)i * jb->ppb];
  char *end = NULL; /* of the last run */
  uint32_t n = 1;
  if (v) v[0] = (struct iovec){prefix, kvt__record_prefix_bytes(c->bt)};
  for (uint32_t k = 0; k < jb->ppb; k++) {
    if (p[k].device || !p[k].registered || (((uintptr_t)p[k].ptr | p[k].len) & (KVT_RECORD_ALIGN - 1))) return 0;
    if (n > 1 && end == p[k].ptr) {
      if (v) v[n - 1].iov_len += p[k].len;
    } else {
      if (n == KVT__STRAIGHT_IOV) return 0;
      if (v) v[n] = (struct iovec){p[k].ptr, p[k].len};
      n++;
    }
    end = p[k].ptr + p[k].len;
  }
  return n;
}

/* Record identity of put block i (the disk store seals the rest). */
static void fill_identity(kvt_cache *c, kvt__sjob *jb, uint32_t i, void *rec, const kvt_key *parent) {
  kvt__record_hdr *h = rec;
  memset(h, 0, sizeof *h);
  h->magic = KVT_RECORD_MAGIC;
  h->version = KVT_RECORD_VERSION;
  h->ns = c->ns;
  h->key = jb->keys[i];
  h->parent = *parent;
  h->payload_len = c->block_bytes;
  if (jb->has_tokens) {
    h->flags |= KVT_RECORD_F_TOKENS;
    h->token_count = c->bt;
    memcpy(kvt__record_tokens(rec), jb->tokens + (size_t)i * c->bt, (size_t)c->bt * sizeof(uint32_t));
  }
}

/* Get: the record's tokens against the batch's (exactness). */
static int verify_tokens(kvt_cache *c, kvt__sjob *jb, uint32_t i, void *rec) {
  const kvt__record_hdr *h = rec;
  if (!jb->has_tokens || !(h->flags & KVT_RECORD_F_TOKENS)) return 0;
  size_t len = (size_t)c->bt * sizeof(uint32_t);
  return memcmp(kvt__record_tokens(rec), jb->tokens + (size_t)i * c->bt, len) ? KVT_EMISMATCH : 0;
}

/* Get from the remote: the record's parent is the one its key was put
 * under (the client checked namespace, key and checksums). */
static int verify_parent(kvt_cache *c, kvt__sjob *jb, uint32_t i, void *rec) {
  const kvt__record_hdr *h = rec;
  const kvt_key *want = jb->opaque ? &c->ns : i ? &jb->keys[i - 1] : &jb->parent0;
  return kvt__key_eq(&h->parent, want) ? 0 : KVT_EMISMATCH;
}

/* ---- commits (c->lock held) ---- */

static void put_commit(kvt_cache *c, kvt__sjob *jb, uint32_t i, int status) {
  kvt__sblock *sb = &jb->blocks[i];
  uint32_t e = sb->entry, slot = kvt__E(c, e)->slot[sb->tier];
  if (status == 0) {
    kvt__index_set_state(&c->map, e, sb->tier, KVT__VALID, slot);
  } else {
    kvt__index_set_state(&c->map, e, sb->tier, KVT__ABSENT, 0);
    if (slot != KVT__NONE) kvt__slots_put(&c->slots[sb->tier], slot);
    kvt__maybe_remove(c, e);
    if (sb->tier == KVT__T_DISK && status != KVT_ENOSPACE) c->st.io_errors++;
    else if (status != KVT_ENOSPACE) c->st.copy_errors++;
  }
  sb->result = status;
}

/* A get from the remote tier is over (no entry: nothing to unpin). */
static void remote_get_commit(kvt_cache *c, kvt__sjob *jb, uint32_t i, int status) {
  if (status == 0) {
    c->st.blocks_remote2h++;
    c->st.bytes_remote2h += c->block_bytes;
  } else {
    kvt__rtier_fetch_failed(c, &jb->keys[i], status);
  }
  jb->blocks[i].result = status;
}

static void get_commit(kvt_cache *c, kvt__sjob *jb, uint32_t i, int status) {
  kvt__sblock *sb = &jb->blocks[i];
  if (sb->tier == KVT__T_REMOTE) {
    remote_get_commit(c, jb, i, status);
    return;
  }
  uint32_t e = sb->entry;
  kvt__index_unpin(&c->map, e, sb->tier);
  kvt__entry *en = kvt__E(c, e);
  if (status == 0) {
    kvt__index_touch(&c->map, e, sb->tier);
  } else {
    if (status == KVT_ECORRUPT) c->st.checksum_failures++;
    else if (status == KVT_EMISMATCH) c->st.verify_mismatches++;
    else if (sb->tier == KVT__T_DISK) c->st.io_errors++;
    else c->st.copy_errors++;
    /* A record that failed its checks or its read is never trusted again. */
    if (sb->tier == KVT__T_DISK && status != KVT_EMISMATCH && en->state[KVT__T_DISK] == KVT__VALID &&
        en->pins[KVT__T_DISK] == 0) {
      kvt__drop_tier(c, e, KVT__T_DISK);
      c->st.evictions_disk++;
      kvt__maybe_remove(c, e);
    }
  }
  sb->result = status;
}

/* ---- the staging ring (disk I/O) ---- */

static void stage_done(void *arg, int status) {
  kvt__stage *st = arg;
  kvt__sworker *w = st->w;
  pthread_mutex_lock(&w->lock);
  st->status = status;
  st->in_flight = 0;
  pthread_cond_broadcast(&w->cond);
  pthread_mutex_unlock(&w->lock);
}

/* A read in part (zero_tail) that failed its checksum: the bytes read are
 * damaged, or the record is sound but not zero past them (another put than
 * the one the caller's pieces describe, say an object put again, longer,
 * since its caller found it). Only the whole record tells which: read here,
 * its checksums checked, and its first bytes given to block i's pieces
 * when it passes (the caller then finds the object is not the one it
 * asked for), so a sound record is never taken for a damaged one. */
static int reread_whole(kvt_cache *c, kvt__sjob *jb, uint32_t i) {
  void *rec = NULL;
  if (posix_memalign(&rec, KVT_RECORD_ALIGN, c->record_bytes)) return -ENOMEM;
  pthread_mutex_lock(&c->lock);
  uint32_t slot = kvt__E(c, jb->blocks[i].entry)->slot[KVT__T_DISK]; /* pinned */
  pthread_mutex_unlock(&c->lock);
  int rc;
  while ((rc = kvt__disk_read_sync(c->disk, slot, rec, &jb->keys[i])) == KVT_EBUSY) usleep(20);
  if (rc == 0) rc = copy_pieces(jb, i, kvt__record_payload(rec, c->bt), 1);
  free(rec);
  return rc;
}

/* ---- KVT_GET_PROMOTE: disk blocks also land in the host tier ---- */

/* sblock.host_slot of a block claimed for promotion (its host state
 * FILLING) while room is made, before it has a slot. */
#define PROMOTE_CLAIMED (KVT__NONE - 1u)

/* Host slots (FILLING) for the get's disk blocks that the host does not
 * hold, as owner mode's restores take them, before any read is submitted.
 * May wait for spills of host victims (never for another storage job: a
 * host tier whose slots are all taken by jobs in flight gives none). A
 * block that gets no slot is loaded unpromoted. Each block is claimed
 * once, FILLING with no slot yet, before room is made: opaque keys may
 * name a block twice, and room for the keys would evict a host block per
 * duplicate for nothing. */
static void promote_take_slots(kvt_cache *c, kvt__sjob *jb) {
  uint32_t need = 0, cap = (uint32_t)c->cap[KVT__T_HOST];
  pthread_mutex_lock(&c->lock);
  for (uint32_t i = 0; i < jb->n_blocks && need < cap; i++) {
    kvt__sblock *sb = &jb->blocks[i];
    if (sb->tier != KVT__T_DISK || sb->entry == KVT__NONE || sb->result != 0 ||
        kvt__E(c, sb->entry)->state[KVT__T_HOST] != KVT__ABSENT)
      continue;
    kvt__index_set_state(&c->map, sb->entry, KVT__T_HOST, KVT__FILLING, KVT__NONE);
    sb->host_slot = PROMOTE_CLAIMED;
    need++;
  }
  /* Short of room: as many slots as are free. Best effort: a host block
   * that cannot spill (the disk's slots pinned) stays, unpromoted over. */
  if (need) kvt__make_room(c, KVT__T_HOST, need, 1 | KVT__ROOM_KEEP);
  for (uint32_t i = 0; i < jb->n_blocks && need; i++) {
    kvt__sblock *sb = &jb->blocks[i];
    if (sb->host_slot != PROMOTE_CLAIMED) continue;
    uint32_t s = kvt__slots_take(&c->slots[KVT__T_HOST]);
    kvt__index_set_state(&c->map, sb->entry, KVT__T_HOST, s == KVT__NONE ? KVT__ABSENT : KVT__FILLING, s);
    sb->host_slot = s;
    c->storage->promoting += s != KVT__NONE;
    need--;
  }
  pthread_mutex_unlock(&c->lock);
  kvt__flush_submits(c); /* spills the room-making started */
}

/* Block i landed (status 0) in the engine's pieces: its record image into
 * its host slot, the prefix (header and tokens, as read and checked) and
 * the payload (from the staging record, or from the pieces the straight
 * read filled). */
static void promote_fill(kvt_cache *c, kvt__sjob *jb, uint32_t i, const kvt__stage *st, int status) {
  if (status != 0) return;
  void *rec = kvt__host_slot(&c->host, jb->blocks[i].host_slot);
  if (!st->n_iov) {
    memcpy(rec, st->rec, c->record_bytes);
    return;
  }
  memcpy(rec, st->rec, kvt__record_prefix_bytes(c->bt));
  copy_pieces(jb, i, kvt__record_payload(rec, c->bt), 0); /* host pieces only (straight): cannot fail */
}

/* The host copy of block i becomes valid, or its slot goes back. Before
 * get_commit, which may drop the entry once no tier holds it. Lock held. */
static void promote_commit(kvt_cache *c, kvt__sjob *jb, uint32_t i, int status) {
  kvt__sblock *sb = &jb->blocks[i];
  if (status == 0) {
    kvt__index_set_state(&c->map, sb->entry, KVT__T_HOST, KVT__VALID, sb->host_slot);
    c->st.blocks_disk2h++;
    c->st.bytes_disk2h += c->block_bytes;
  } else {
    kvt__index_set_state(&c->map, sb->entry, KVT__T_HOST, KVT__ABSENT, 0);
    kvt__slots_put(&c->slots[KVT__T_HOST], sb->host_slot);
  }
  sb->host_slot = KVT__NONE;
  c->storage->promoting--;
  pthread_cond_broadcast(&c->cond); /* a put waiting for host room (put_take_slots) */
}

/* Waits for stage k's I/O and hands its block to the job. */
static void stage_retire(kvt_cache *c, kvt__sworker *w, kvt__sjob *jb, kvt__stage *st) {
  if (st->block == KVT__NONE) return;
  pthread_mutex_lock(&w->lock);
  while (st->in_flight) pthread_cond_wait(&w->cond, &w->lock);
  int status = st->status;
  pthread_mutex_unlock(&w->lock);
  uint32_t i = st->block;
  st->block = KVT__NONE;
  if (jb->kind == KVT__SJ_GET) {
    /* Straight: the payload is already in the engine's pieces (and, on a
     * failure, so may be any bytes: the block is reported not landed). A
     * disk read landed unchecked (verify_later): its checksums run here,
     * on the worker that waited for it, before anything reads it. */
    if (status == 0 && jb->blocks[i].tier == KVT__T_DISK) {
      kvt__disk_io io = {.rec = st->rec, .expected_key = &jb->keys[i], .iov = st->n_iov ? st->iov : NULL,
                         .n_iov = st->n_iov, .zero_tail = jb->zero_tail && st->n_iov};
      status = kvt__disk_verify(c->disk, &io);
      if (status == KVT_ECORRUPT && io.zero_tail) status = reread_whole(c, jb, i);
    }
    if (status == 0 && jb->blocks[i].tier == KVT__T_REMOTE) status = verify_parent(c, jb, i, st->rec);
    if (status == 0) status = verify_tokens(c, jb, i, st->rec);
    if (status == 0 && !st->n_iov) status = copy_pieces(jb, i, kvt__record_payload(st->rec, c->bt), 1);
    if (jb->blocks[i].host_slot != KVT__NONE) promote_fill(c, jb, i, st, status);
  }
  pthread_mutex_lock(&c->lock);
  if (jb->kind == KVT__SJ_GET && jb->blocks[i].host_slot != KVT__NONE) promote_commit(c, jb, i, status);
  if (jb->kind == KVT__SJ_GET) get_commit(c, jb, i, status);
  else put_commit(c, jb, i, status);
  if (status == 0 && jb->blocks[i].tier == KVT__T_DISK) {
    if (st->n_iov) c->st.storage_blocks_straight++;
    else c->st.storage_blocks_staged++;
    if (st->n_iov && st->fixed) c->st.storage_blocks_fixed++;
  }
  pthread_mutex_unlock(&c->lock);
}

/* A stage of the ring whose I/O is over (its block retired here) or that
 * is idle, the first from *next on; waits while all are in flight. Any
 * finished one will do: waiting for the oldest would idle the disk behind
 * one record held up (a checksum thread not scheduled, a slow request). */
static kvt__stage *ring_take(kvt_cache *c, kvt__sworker *w, kvt__sjob *jb, kvt__stage *ring, uint32_t n,
                             uint32_t *next) {
  kvt__stage *st = NULL;
  pthread_mutex_lock(&w->lock);
  while (!st) {
    for (uint32_t k = 0; k < n && !st; k++)
      if (!ring[(*next + k) % n].in_flight) {
        st = &ring[(*next + k) % n];
        *next = (*next + k + 1) % n;
      }
    if (!st) pthread_cond_wait(&w->cond, &w->lock);
  }
  pthread_mutex_unlock(&w->lock);
  stage_retire(c, w, jb, st);
  return st;
}

/* The next stage for block i, its previous block retired: a straight one
 * (its iovecs filled in, one of the ring's first `window`) when the block
 * can go straight, else a staging record (n_iov 0). */
static kvt__stage *stage_next(kvt_cache *c, kvt__sworker *w, kvt__sjob *jb, uint32_t i, uint32_t window) {
  kvt__stage *st;
  /* A remote block arrives as a whole record image: always a staging one. */
  int remote = jb->kind == KVT__SJ_GET && jb->blocks[i].tier == KVT__T_REMOTE;
  if (!remote && straight_iov(c, jb, i, NULL, NULL)) {
    st = ring_take(c, w, jb, w->straight, window, &w->next_straight);
    st->n_iov = straight_iov(c, jb, i, st->rec, st->iov);
  } else {
    st = ring_take(c, w, jb, w->stage, KVT__STAGE_DEPTH, &w->next);
    st->n_iov = 0;
  }
  return st;
}

/* Stage st takes block i: in flight from now on (ring_take passes it by). */
static void stage_claim(kvt__stage *st, uint32_t i) {
  st->block = i;
  st->in_flight = 1;
  st->status = 0;
  st->fixed = 0;
}

/* The disk read of block i into stage st, unsubmitted. */
static kvt__disk_io stage_read_io(kvt_cache *c, kvt__stage *st, uint32_t i, kvt__sjob *jb) {
  pthread_mutex_lock(&c->lock);
  uint32_t slot = kvt__E(c, jb->blocks[i].entry)->slot[KVT__T_DISK];
  pthread_mutex_unlock(&c->lock);
  return (kvt__disk_io){.slot = slot, .rec = st->rec, .arg = st, .iov = st->n_iov ? st->iov : NULL,
                        .n_iov = st->n_iov, .expected_key = &jb->keys[i],
                        .verify_later = 1 /* checked at retirement, on this worker */,
                        .zero_tail = jb->zero_tail && st->n_iov /* pieces may end early: read no further */};
}

/* Submits the disk reads ios[0..n) of stages sts[0..n) as one batch (one
 * submission, so a virtual disk takes them in one pass). Two gets of one
 * block both read its slot, and the store takes one operation per slot at
 * a time: a read refused for that (KVT_EBUSY) goes again alone once the
 * other is over. A read refused otherwise ends at once. */
static void stage_read_batch(kvt_cache *c, kvt__stage **sts, kvt__disk_io *ios, uint32_t n) {
  if (!n) return;
  int rc = kvt__disk_read_batch(c->disk, ios, n, stage_done);
  for (uint32_t j = 0; j < n; j++) {
    int st = rc < 0 ? rc : ios[j].status;
    while (st == KVT_EBUSY) {
      usleep(20);
      rc = kvt__disk_read_batch(c->disk, &ios[j], 1, stage_done);
      st = rc < 0 ? rc : ios[j].status;
    }
    sts[j]->fixed = st == 0 && ios[j].fixed; /* read by this worker only, at retirement */
    if (st != 0) stage_done(sts[j], st);
  }
}

static void stage_submit(kvt_cache *c, kvt__stage *st, uint32_t i, kvt__sjob *jb) {
  stage_claim(st, i);
  if (jb->kind == KVT__SJ_GET && jb->blocks[i].tier == KVT__T_REMOTE) {
    kvt__remote *r = kvt__rtier(c);
    kvt__remote_io io = {.key = jb->keys[i], .rec = st->rec, .arg = st};
    int q = r ? kvt__remote_get(r, &io, 1, stage_done) : KVT_EREMOTE;
    if (q < 0 || io.status) stage_done(st, q < 0 ? q : io.status);
    return;
  }
  if (jb->kind == KVT__SJ_GET) {
    kvt__disk_io io = stage_read_io(c, st, i, jb);
    stage_read_batch(c, &st, &io, 1);
    return;
  }
  uint32_t slot;
  pthread_mutex_lock(&c->lock);
  slot = kvt__E(c, jb->blocks[i].entry)->slot[KVT__T_DISK];
  pthread_mutex_unlock(&c->lock);
  kvt__disk_io io = {.slot = slot, .rec = st->rec, .arg = st, .iov = st->n_iov ? st->iov : NULL, .n_iov = st->n_iov};
  int rc = kvt__disk_write_batch(c->disk, &io, 1, stage_done);
  if (rc >= 0) rc = io.status;
  st->fixed = rc == 0 && io.fixed;
  if (rc != 0) stage_done(st, rc);
}

/* A stage of ring[0..n) holding a block whose I/O is over, else NULL;
 * *busy is set when one holds a block still in flight. w->lock held. */
static kvt__stage *ring_landed(kvt__stage *ring, uint32_t n, int *busy) {
  for (uint32_t k = 0; k < n; k++) {
    if (ring[k].block == KVT__NONE) continue;
    if (!ring[k].in_flight) return &ring[k];
    *busy = 1;
  }
  return NULL;
}

/* Retires every stage holding a block, each as soon as its I/O is over.
 * In ring order, a stage reused late (a job of more blocks than the ring
 * holds) would hold back every block behind it, and with them their
 * checksums (verify_later), which would then all run after the last
 * read instead of while the others are at the disk. */
static void stage_drain(kvt_cache *c, kvt__sworker *w, kvt__sjob *jb) {
  for (;;) {
    kvt__stage *st = NULL;
    int busy;
    pthread_mutex_lock(&w->lock);
    for (;;) {
      busy = 0;
      st = ring_landed(w->stage, KVT__STAGE_DEPTH, &busy);
      if (!st) st = ring_landed(w->straight, KVT__STRAIGHT_DEPTH, &busy);
      if (st || !busy) break;
      pthread_cond_wait(&w->cond, &w->lock);
    }
    pthread_mutex_unlock(&w->lock);
    if (!st) return;
    stage_retire(c, w, jb, st);
  }
}

/* ---- puts ---- */

/* Gives blocks [from, to) of the put their slots; blocks that get none fail
 * with the reason. Lock held; may wait for spills and for
 * host slots promoting gets hold. */
static void put_take_slots(kvt_cache *c, kvt__sjob *jb, uint32_t from, uint32_t to, int tier) {
  uint32_t need = 0;
  for (uint32_t i = from; i < to; i++) need += jb->blocks[i].entry != KVT__NONE && jb->blocks[i].result == 0;
  int rc = need ? kvt__make_room(c, tier, need, 1) : 0;
  /* Host slots a promoting get holds are not evictable until its reads
   * land them (never waiting for a put): room then, not a failure. */
  while (rc == KVT_ENOSPACE && tier == KVT__T_HOST && c->storage->promoting) {
    pthread_cond_wait(&c->cond, &c->lock);
    rc = kvt__make_room(c, tier, need, 1);
  }
  for (uint32_t i = from; i < to; i++) {
    kvt__sblock *sb = &jb->blocks[i];
    if (sb->entry == KVT__NONE || sb->result != 0) continue;
    uint32_t s = rc == 0 ? kvt__slots_take(&c->slots[tier]) : KVT__NONE;
    if (s == KVT__NONE) {
      put_commit(c, jb, i, rc ? rc : KVT_ENOSPACE);
      sb->entry = KVT__NONE;
      continue;
    }
    kvt__index_set_state(&c->map, sb->entry, tier, KVT__FILLING, s);
  }
}

static void run_put(kvt_cache *c, kvt__sworker *w, kvt__sjob *jb) {
  int tier = jb->blocks[0].tier;
  kvt__storage *s = c->storage;
  /* Chunks small enough that every worker's claims fit in the tier at once. */
  uint32_t chunk = (uint32_t)(c->cap[tier] / (s->n_workers + 1));
  if (chunk == 0) chunk = 1;
  if (chunk > KVT__STAGE_DEPTH * 4) chunk = KVT__STAGE_DEPTH * 4;
  for (uint32_t from = 0; from < jb->n_blocks; from += chunk) {
    uint32_t to = from + chunk < jb->n_blocks ? from + chunk : jb->n_blocks;
    pthread_mutex_lock(&c->lock);
    /* Blocks still in flight hold their slots, and only this worker can
     * retire them: when the tier has too few free slots for this chunk,
     * they finish first (and become evictable) before room is made, which
     * may wait. With enough free slots, taking them waits for nothing, so
     * the disk stays busy while this chunk starts. */
    if (c->slots[tier].n_free < to - from) {
      pthread_mutex_unlock(&c->lock);
      stage_drain(c, w, jb);
      pthread_mutex_lock(&c->lock);
    }
    put_take_slots(c, jb, from, to, tier);
    pthread_mutex_unlock(&c->lock);
    kvt__flush_submits(c); /* spills the room-making started */
    for (uint32_t i = from; i < to; i++) {
      kvt__sblock *sb = &jb->blocks[i];
      if (sb->entry == KVT__NONE || sb->result != 0) continue;
      const kvt_key *parent = &kvt__E(c, sb->entry)->parent; /* set at insert, never changed */
      if (tier == KVT__T_HOST) {
        void *rec = kvt__host_slot(&c->host, kvt__E(c, sb->entry)->slot[KVT__T_HOST]);
        fill_identity(c, jb, i, rec, parent);
        int rc = copy_pieces(jb, i, kvt__record_payload(rec, c->bt), 0);
        pthread_mutex_lock(&c->lock);
        put_commit(c, jb, i, rc);
        pthread_mutex_unlock(&c->lock);
      } else {
        kvt__stage *st = stage_next(c, w, jb, i, KVT__STRAIGHT_DEPTH);
        fill_identity(c, jb, i, st->rec, parent);
        int rc = st->n_iov ? 0 : copy_pieces(jb, i, kvt__record_payload(st->rec, c->bt), 0);
        if (rc) {
          pthread_mutex_lock(&c->lock);
          put_commit(c, jb, i, rc);
          pthread_mutex_unlock(&c->lock);
          continue;
        }
        stage_submit(c, st, i, jb);
      }
    }
  }
  stage_drain(c, w, jb);
}

/* ---- gets ---- */

/* Disk reads of a get submitted together: a virtual disk serves the
 * requests it finds queued in one pass, so reads submitted one by one
 * (a system call each, microseconds apart) reach it in several passes. */
#define GET_BATCH 32u

/* Straight reads a get keeps in flight per worker (see KVT__STRAIGHT_MIN_WINDOW):
 * a quarter of the blocks it reads from disk. */
static uint32_t straight_window(const kvt__sjob *jb) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < jb->n_blocks; i++) n += jb->blocks[i].entry != KVT__NONE && jb->blocks[i].tier == KVT__T_DISK;
  n /= 4;
  return n < KVT__STRAIGHT_MIN_WINDOW ? KVT__STRAIGHT_MIN_WINDOW : n > KVT__STRAIGHT_DEPTH ? KVT__STRAIGHT_DEPTH : n;
}

static void run_get(kvt_cache *c, kvt__sworker *w, kvt__sjob *jb) {
  kvt__stage *sts[GET_BATCH];
  kvt__disk_io ios[GET_BATCH];
  uint32_t pending = 0, window = straight_window(jb);
  if (jb->promote) promote_take_slots(c, jb);
  for (uint32_t i = 0; i < jb->n_blocks; i++) {
    kvt__sblock *sb = &jb->blocks[i];
    if (sb->entry == KVT__NONE && sb->tier != KVT__T_REMOTE) continue;
    if (sb->tier == KVT__T_DISK) {
      /* At most half of a ring's stages wait unsubmitted, so a ring_take
       * that waits has a submitted one to wait for. */
      uint32_t ring = straight_iov(c, jb, i, NULL, NULL) ? window : KVT__STAGE_DEPTH;
      if (pending >= ring / 2) stage_read_batch(c, sts, ios, pending), pending = 0;
      kvt__stage *st = stage_next(c, w, jb, i, window);
      stage_claim(st, i);
      sts[pending] = st;
      ios[pending++] = stage_read_io(c, st, i, jb);
      if (pending == GET_BATCH) stage_read_batch(c, sts, ios, pending), pending = 0;
      continue;
    }
    stage_read_batch(c, sts, ios, pending);
    pending = 0;
    if (sb->tier == KVT__T_HOST) {
      /* Pinned: the slot holds this block until the unpin. */
      void *rec = kvt__host_slot(&c->host, kvt__E(c, sb->entry)->slot[KVT__T_HOST]);
      int rc = verify_tokens(c, jb, i, rec);
      if (rc == 0) rc = copy_pieces(jb, i, kvt__record_payload(rec, c->bt), 1);
      pthread_mutex_lock(&c->lock);
      get_commit(c, jb, i, rc);
      pthread_mutex_unlock(&c->lock);
    } else {
      stage_submit(c, stage_next(c, w, jb, i, window), i, jb);
    }
  }
  stage_read_batch(c, sts, ios, pending);
  stage_drain(c, w, jb);
}

/* ---- the worker ---- */

/* A get's loaded blocks become the most recent in every tier holding them,
 * last block first, as owner mode's kvt_release does: a chain's ancestors
 * outlive its tails. Found again by key: an entry unpinned at its commit
 * may since have gone. Puts touch nothing, as kvt_store does not. Lock held. */
static void touch_loaded(kvt_cache *c, const kvt__sjob *jb) {
  for (uint32_t i = jb->n_blocks; i-- > 0;) {
    if (jb->blocks[i].entry == KVT__NONE || jb->blocks[i].result != 0) continue;
    uint32_t e = kvt__index_find(&c->map, &jb->keys[i]);
    if (e == KVT__NONE) continue;
    kvt__index_touch(&c->map, e, KVT__T_HOST);
    kvt__index_touch(&c->map, e, KVT__T_DISK);
  }
}

static void finish(kvt_cache *c, kvt__sjob *jb, uint32_t j) {
  kvt__storage *s = c->storage;
  if (jb->kind == KVT__SJ_GET) touch_loaded(c, jb);
  for (uint32_t i = 0; i < jb->n_blocks && !jb->status; i++)
    if (jb->blocks[i].result < 0) jb->status = jb->blocks[i].result;
  for (uint64_t m = jb->regions, r = 0; m; r++, m >>= 1)
    if (m & 1) s->regions[r].users--;
  jb->done = 1;
  s->active--;
  if (jb->user) {
    s->done_q[(s->d_head + s->d_len++) % c->cfg.max_jobs] = j;
  } else {
    jb->busy = 0;
    s->free_jobs[s->n_free++] = j;
  }
  pthread_cond_broadcast(&c->cond);
}

void *kvt__storage_worker(void *arg) {
  kvt__sworker *w = arg;
  kvt_cache *c = w->c;
  kvt__storage *s = c->storage;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    while (!s->q_len && !s->stop) pthread_cond_wait(&s->work, &c->lock);
    if (!s->q_len) break;
    uint32_t j = s->queue[s->q_head];
    s->q_head = (s->q_head + 1) % c->cfg.max_jobs;
    s->q_len--;
    kvt__sjob *jb = &s->jobs[j];
    pthread_mutex_unlock(&c->lock);
    if (jb->kind == KVT__SJ_PUT) run_put(c, w, jb);
    else run_get(c, w, jb);
    kvt__storage_write_through(c, jb);
    pthread_mutex_lock(&c->lock);
    finish(c, jb, j);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}
