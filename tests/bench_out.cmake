# A benchmark's --out DIR is made at the start (with its parents), or refused at the start
# when it can't be: never a whole run and then "can't write DIR/...". Run without a driver
# (the benchmark then exits 77, skipped, right after reading its arguments).
#
# -D: PROGRAM (a benchmark), NAME (its name in messages), WORK_DIR.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(env ${CMAKE_COMMAND} -E env SAFECUDA_LIBCUDA=/nonexistent/libcuda.so.1 --unset=SAFECUDA_DEVICE)

# A folder that does not exist yet, two levels deep: made, then the run goes on (77 here).
execute_process(COMMAND ${env} ${PROGRAM} --quick --out ${WORK_DIR}/new/results
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 77)
  message(FATAL_ERROR "${NAME} --out new/results: exit ${rc}, expected 77 (no driver)\n${out}${err}")
endif()
if(NOT IS_DIRECTORY ${WORK_DIR}/new/results)
  message(FATAL_ERROR "${NAME} --out new/results: the folder was not made\n${out}${err}")
endif()

# A folder that can't be made (under a file): refused before anything runs, exit 2, saying
# which folder and why.
file(WRITE ${WORK_DIR}/a-file "not a folder\n")
execute_process(COMMAND ${env} ${PROGRAM} --quick --out=${WORK_DIR}/a-file/results
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "${NAME} --out a-file/results: exit ${rc}, expected 2\n${out}${err}")
endif()
set(want "${NAME}: --out ${WORK_DIR}/a-file/results: can't make the folder: Not a directory")
string(FIND "${out}${err}" "${want}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${NAME} --out a-file/results: the output lacks '${want}':\n${out}${err}")
endif()
string(FIND "${out}${err}" "skipped" at)
if(NOT at EQUAL -1)
  message(FATAL_ERROR "${NAME} --out a-file/results: went on past its arguments:\n${out}${err}")
endif()
message(STATUS "${NAME}: --out made and refused as expected")
