# llama.cpp, for examples/llama_cpp and its tests: found where
# scripts/llama-deps.sh built it (KVT_LLAMA_DIR, or the environment variable
# of that name), never downloaded by CMake. Sets KVT_LLAMA_FOUND, the
# imported target kvt::llama, KVT_LLAMA_MODEL (the small test model) and
# KVT_LLAMA_BENCH_MODEL, or KVT_LLAMA_WHY (why not).
set(KVT_LLAMA_DIR "$ENV{KVT_LLAMA_DIR}" CACHE PATH
  "Where scripts/llama-deps.sh put llama.cpp (the directory it prints)")
set(KVT_LLAMA_FOUND OFF)
set(KVT_LLAMA_WHY "llama.cpp was not built: run scripts/llama-deps.sh and configure with -DKVT_LLAMA_DIR=<the directory it prints>")
if(KVT_LLAMA_DIR)
  find_library(KVT_LLAMA_LIB NAMES llama PATHS ${KVT_LLAMA_DIR}/install/lib ${KVT_LLAMA_DIR}/install/lib64 NO_DEFAULT_PATH)
  find_path(KVT_LLAMA_INCLUDE llama.h PATHS ${KVT_LLAMA_DIR}/install/include NO_DEFAULT_PATH)
  set(KVT_LLAMA_MODEL ${KVT_LLAMA_DIR}/models/random-4x256.gguf)
  set(KVT_LLAMA_BENCH_MODEL ${KVT_LLAMA_DIR}/models/random-8x512.gguf)
  if(KVT_LLAMA_LIB AND KVT_LLAMA_INCLUDE AND EXISTS ${KVT_LLAMA_MODEL})
    set(KVT_LLAMA_FOUND ON)
    add_library(kvt::llama SHARED IMPORTED)
    set_target_properties(kvt::llama PROPERTIES IMPORTED_LOCATION ${KVT_LLAMA_LIB})
    target_include_directories(kvt::llama SYSTEM INTERFACE ${KVT_LLAMA_INCLUDE})
    # libllama finds its libggml* beside it only through the executable's
    # rpath: an old-style DT_RPATH, which (unlike DT_RUNPATH) serves the
    # libraries' own dependencies too.
    get_filename_component(KVT_LLAMA_LIBDIR ${KVT_LLAMA_LIB} DIRECTORY)
    target_link_options(kvt::llama INTERFACE "LINKER:--disable-new-dtags,-rpath,${KVT_LLAMA_LIBDIR}")
  else()
    set(KVT_LLAMA_WHY "no libllama, llama.h or test model under KVT_LLAMA_DIR=${KVT_LLAMA_DIR}: run scripts/llama-deps.sh")
  endif()
endif()
if(KVT_LLAMA_FOUND)
  message(STATUS "kvtier: llama.cpp from ${KVT_LLAMA_DIR}: examples/llama_cpp and its tests")
else()
  message(STATUS "kvtier: without llama.cpp (${KVT_LLAMA_WHY})")
endif()
