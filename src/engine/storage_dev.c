/* Device memory in storage mode: CUDA device pieces are copied with the
 * CUDA runtime to and from the record image (a host-pool slot or a
 * worker's staging record). Without the CUDA backend, device regions are
 * refused at registration. */
#include <errno.h>

#include "engine/storage.h"

#ifdef KVT_HAVE_CUDA
#include <cuda_runtime_api.h>

int kvt__storage_dev_check(void *base, size_t len) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    return KVT_ENODEV;
  }
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, base) != cudaSuccess || a.type != cudaMemoryTypeDevice) {
    (void)cudaGetLastError();
    return KVT_ENODEV;
  }
  (void)len;
  return 0;
}

int kvt__storage_dev_copy(void *dst, const void *src, size_t len, int to_device) {
  cudaError_t e = cudaMemcpy(dst, src, len, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return -EIO;
  }
  return 0;
}
#else
int kvt__storage_dev_check(void *base, size_t len) {
  (void)base;
  (void)len;
  return KVT_EUNSUPPORTED;
}

int kvt__storage_dev_copy(void *dst, const void *src, size_t len, int to_device) {
  (void)dst;
  (void)src;
  (void)len;
  (void)to_device;
  return KVT_EUNSUPPORTED;
}
#endif
