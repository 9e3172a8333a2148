# test_tinyllm_exact runs the tinyllm example model (examples/tinyllm) small.
set(TINYLLM_DIR ${PROJECT_SOURCE_DIR}/examples/tinyllm)
target_sources(${name} PRIVATE ${TINYLLM_DIR}/tl_model.c ${TINYLLM_DIR}/tl_kernels.c ${TINYLLM_DIR}/tl_engine.c)
target_include_directories(${name} PRIVATE ${TINYLLM_DIR})
# Same code generation as the example: a * b + c must fuse like fmaf().
target_compile_options(${name} PRIVATE -O2 -ffp-contract=fast -Wno-psabi)
target_link_libraries(${name} PRIVATE m)
