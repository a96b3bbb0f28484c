# The README's code blocks must be the examples verbatim (which the build compiles): the
# tour (examples/tour.c) and the test-device example (examples/testdevice_test.c).
file(READ ${SOURCE_DIR}/README.md readme)
foreach(example tour testdevice_test)
  file(READ ${SOURCE_DIR}/examples/${example}.c code)
  string(FIND "${readme}" "```c\n${code}```" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "README.md's copy of examples/${example}.c differs from the file: "
                        "copy one into the other")
  endif()
endforeach()
