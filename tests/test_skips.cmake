# scripts/test-skips: the summary that scripts/test prints after ctest, naming why each
# skipped test skipped (ctest itself prints "(Skipped)" with no reason). Checked on a canned
# ctest output and LastTest.log: tests that skipped for the same reason are one line, each
# reason is the test's own words, a test without output says so, and passed tests are not
# listed.
#
# -D: SOURCE_DIR, WORK_DIR.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR}/build/Testing/Temporary)
set(no_driver "sc_device_count: cannot load the CUDA driver library: tried libcuda.so.1 (cannot open shared object file: No such file or directory)")
function(log_block name output)
  file(APPEND ${WORK_DIR}/build/Testing/Temporary/LastTest.log
"----------------------------------------------------------
1/9 Testing: ${name}
1/9 Test: ${name}
Command: \"/build/tests/${name}\"
Directory: /build/tests
\"${name}\" start time: Nov 28 00:53 UTC
Output:
----------------------------------------------------------
${output}<end of output>
Test time =   0.01 sec
----------------------------------------------------------
Test Passed.
\"${name}\" end time: Nov 28 00:53 UTC
\"${name}\" time elapsed: 00:00:00
----------------------------------------------------------

")
endfunction()
file(WRITE ${WORK_DIR}/build/Testing/Temporary/LastTest.log "Start testing: Nov 28 00:53 UTC\n")
log_block(test_status "test_status: all checks passed\n")
log_block(test_gpu_device "test_gpu_device.c: skipped: ${no_driver}\n")
log_block(test_gpu_memory "test_gpu_memory.c: skipped: ${no_driver}\n")
log_block(test_example_graph_decode "graph_decode: sc_context_create: no driver here\n  (detail)\n")
log_block(test_quiet "")
file(WRITE ${WORK_DIR}/ctest.txt
"100% tests passed, 0 tests failed out of 5

The following tests did not run:
\t  2 - test_gpu_device (Skipped)
\t  3 - test_gpu_memory (Skipped)
\t  4 - test_example_graph_decode (Skipped)
\t  5 - test_quiet (Skipped)
")
execute_process(COMMAND ${SOURCE_DIR}/scripts/test-skips ${WORK_DIR}/build ${WORK_DIR}/ctest.txt
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "scripts/test-skips exited ${rc}:\n${out}${err}")
endif()
foreach(want
    "scripts/test: 4 tests skipped; why:\n"
    "  test_gpu_device, test_gpu_memory: ${no_driver}\n"
    "  test_example_graph_decode: graph_decode: sc_context_create: no driver here\n"
    "  test_quiet: (it printed nothing)\n")
  string(FIND "${out}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "scripts/test-skips: the output lacks '${want}':\n${out}${err}")
  endif()
endforeach()
string(FIND "${out}" "test_status" at)
if(NOT at EQUAL -1)
  message(FATAL_ERROR "scripts/test-skips lists a test that passed:\n${out}")
endif()
# .ci/run counts the skipped tests from ctest's own lines: the summary must not look like one.
string(REGEX MATCH "\n[ \t]+[0-9]+ - [^\n]* \\(Skipped\\)" looks_like "\n${out}")
if(looks_like)
  message(FATAL_ERROR "scripts/test-skips prints a line like ctest's:\n${out}")
endif()
# Nothing skipped: nothing said.
file(WRITE ${WORK_DIR}/ctest.txt "100% tests passed, 0 tests failed out of 1\n")
execute_process(COMMAND ${SOURCE_DIR}/scripts/test-skips ${WORK_DIR}/build ${WORK_DIR}/ctest.txt
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out STREQUAL "")
  message(FATAL_ERROR "scripts/test-skips with nothing skipped: exit ${rc}, said:\n${out}${err}")
endif()
message(STATUS "scripts/test-skips: as expected")
