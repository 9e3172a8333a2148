/* Tuning constants of the CUDA backend, with how each was chosen (zstd's
 * clevels.h is the model). `kvtier-bench gpu` measures the copy paths that
 * these choose between; rerun it on new hardware and update the table.
 *
 * Status: UNMEASURED. No GPU was available when these were written; the
 * defaults below are reasoned from public figures, not measured here. */
#ifndef KVT_DEV_CUDA_TUNING_H
#define KVT_DEV_CUDA_TUNING_H

/* Copies whose typical size (block bytes / runs per block after merging)
 * is below this go through the SM gather/scatter kernel over mapped pinned
 * memory instead of the copy engines.
 *
 * Reasoning: a copy-engine copy costs ~1-2 us of setup even when batched
 * ("a few microseconds per call"); at ~55 GB/s (PCIe 5 x16,
 * H100/H200) a 32 KiB piece is 0.6 us on the wire, so the copy engines
 * reach well under half of the link there, while a zero-copy kernel pays
 * one launch per transfer (per layer for loads) and then streams at close
 * to link rate. At 256 KiB (4.8 us on the wire) the engines are at ~75-85%
 * and need no SMs, so the crossover is placed between: 128 KiB.
 *
 * To measure: `kvtier-bench gpu` prints, per piece size, GB/s of the batch,
 * memcpy and kernel paths; set this to the smallest size at which the
 * batch path is within 5% of the kernel path. */
#define KVT_CUDA_KERNEL_MAX_PIECE_BYTES (128u * 1024u)

/* Host pool pinning granularity: cudaHostRegister per chunk of the one
 * contiguous mmap region. Large single registrations fail on some drivers
 * and hold the driver lock for seconds; 256 MiB keeps each call short. */
#define KVT_CUDA_PIN_CHUNK_BYTES ((size_t)256 << 20)

/* Runs coalesced and issued per cudaMemcpyBatchAsync call (the scratch
 * buffers of one stream, allocated at open). */
#define KVT_CUDA_RUNS_PER_BATCH 4096u

/* Kernel path: per-block descriptors (host address + slot, 16 B each) live
 * in a ring of mapped pinned memory per stream, so a transfer needs no
 * allocation; a transfer that does not fit uses the copy engines. */
#define KVT_CUDA_DESC_RING_ENTRIES (64u * 1024u)

/* Kernel path launch shape: work items of this many bytes (a piece is cut
 * into items), 256 threads per CTA, CTAs per SM. One CTA per SM keeps
 * ~2 MiB of 16-byte loads in flight on an H200 (far above the link's
 * bandwidth-delay product) while leaving most of each SM to the engine. */
#define KVT_CUDA_KERNEL_ITEM_BYTES (64u * 1024u)
#define KVT_CUDA_KERNEL_THREADS 256u
#define KVT_CUDA_KERNEL_CTAS_PER_SM 1u

#endif
