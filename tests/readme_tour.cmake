# The README's tour must be examples/tour.c verbatim (which the build compiles).
file(READ ${SOURCE_DIR}/README.md readme)
file(READ ${SOURCE_DIR}/examples/tour.c tour)
string(FIND "${readme}" "```c\n${tour}```" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md's tour and examples/tour.c differ: copy one into the other")
endif()
