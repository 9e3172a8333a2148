# test_trace drives bench/trace.c (which reads traces with cJSON); included
# from tests/CMakeLists.txt's foreach.
pkg_check_modules(CJSON REQUIRED IMPORTED_TARGET libcjson)
target_sources(${name} PRIVATE ${PROJECT_SOURCE_DIR}/bench/trace.c)
target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/bench)
target_link_libraries(${name} PRIVATE PkgConfig::CJSON m)
# The replay command line refuses a zero payload scale in words.
if(KVT_BUILD_BENCH)
  add_test(NAME bench_replay_payload_scale_zero COMMAND kvtier-bench replay --payload-scale 0)
  set_tests_properties(bench_replay_payload_scale_zero PROPERTIES
    PASS_REGULAR_EXPRESSION "--payload-scale '0': must be at least 1")
endif()
