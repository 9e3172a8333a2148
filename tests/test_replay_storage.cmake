# test_replay_storage drives bench/replay_core.c and replay_storage.c (owner
# and storage mode) on the bundled trace; included from tests/CMakeLists.txt.
include(${CMAKE_CURRENT_SOURCE_DIR}/test_replay_lru.cmake)
