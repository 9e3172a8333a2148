#include <kvtier/kvtier.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  kvt_config cfg;
  kvt_config_init(&cfg);
  cfg.model_fingerprint = "consumer";
  cfg.device = KVT_DEVICE_HOST;
  kvt_cache *c;
  int rc = kvt_open(&cfg, &c);
  if (rc) {
    fprintf(stderr, "kvt_open: %s\n", kvt_strerror(rc));
    return 1;
  }
  kvt_close(c);
  printf("kvtier %s linked (header %s)\n", kvt_version(), KVT_VERSION_STRING);
  return strcmp(kvt_version(), KVT_VERSION_STRING) != 0;
}
