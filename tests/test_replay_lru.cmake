# test_replay_lru drives bench/replay_core.c (with replay_storage.c) and bench/trace.c (which read
# traces with cJSON); included from tests/CMakeLists.txt's foreach.
pkg_check_modules(CJSON REQUIRED IMPORTED_TARGET libcjson)
target_sources(${name} PRIVATE ${PROJECT_SOURCE_DIR}/bench/replay_core.c
  ${PROJECT_SOURCE_DIR}/bench/replay_storage.c ${PROJECT_SOURCE_DIR}/bench/trace.c)
target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/bench)
target_link_libraries(${name} PRIVATE PkgConfig::CJSON m)
