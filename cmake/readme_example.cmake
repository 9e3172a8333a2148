# Checks that README.md shows examples/quickstart.c exactly: the ```c block
# that follows the line "<!-- examples/quickstart.c -->".
#   cmake -DREADME=README.md -DEXAMPLE=examples/quickstart.c -P readme_example.cmake
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "<!-- examples/quickstart.c -->\n```c\n" start)
if(start LESS 0)
  message(FATAL_ERROR "README.md has no <!-- examples/quickstart.c --> code block")
endif()
string(LENGTH "<!-- examples/quickstart.c -->\n```c\n" marker_len)
math(EXPR start "${start} + ${marker_len}")
string(SUBSTRING "${readme}" ${start} -1 rest)
string(FIND "${rest}" "```\n" end)
if(end LESS 0)
  message(FATAL_ERROR "README.md: the quickstart code block is not closed")
endif()
string(SUBSTRING "${rest}" 0 ${end} block)
if(NOT block STREQUAL example)
  message(FATAL_ERROR "README.md's example differs from ${EXAMPLE}: copy the file into "
    "the README's code block")
endif()
message(STATUS "README.md's example equals ${EXAMPLE}")
