# test_metrics parses the JSON exposition with cJSON.
pkg_check_modules(CJSON REQUIRED IMPORTED_TARGET libcjson)
target_link_libraries(${name} PRIVATE PkgConfig::CJSON m)
