# test_trace drives bench/trace.c (which reads traces with cJSON); included
# from tests/CMakeLists.txt's foreach.
pkg_check_modules(CJSON REQUIRED IMPORTED_TARGET libcjson)
target_sources(${name} PRIVATE ${PROJECT_SOURCE_DIR}/bench/trace.c)
target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/bench)
target_link_libraries(${name} PRIVATE PkgConfig::CJSON m)
