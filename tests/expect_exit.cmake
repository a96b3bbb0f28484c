# Run PROGRAM and require exit status EXPECT and, when OUTPUT_HAS is given, that text in its
# output: for programs whose status means more than pass or fail (the examples exit 2 where
# there is no GPU to run on).
execute_process(COMMAND ${PROGRAM} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT "${rc}" STREQUAL "${EXPECT}")
  message(FATAL_ERROR "${PROGRAM} exited with '${rc}', expected ${EXPECT}\n"
                      "stdout:\n${out}\nstderr:\n${err}")
endif()
if(DEFINED OUTPUT_HAS)
  string(FIND "${out}${err}" "${OUTPUT_HAS}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${PROGRAM} exited with ${rc} as expected, but its output lacks "
                        "'${OUTPUT_HAS}':\nstdout:\n${out}\nstderr:\n${err}")
  endif()
endif()
message(STATUS "exit ${rc} as expected:\n${out}${err}")
