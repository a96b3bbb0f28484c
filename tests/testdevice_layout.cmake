# The test device's sources stay readable: no file of testdevice/ over 900 lines (split by
# concept instead: testdevice_internal.h lists the files), and every entry point states its
# validation in one CHECKS line (testdevice_internal.h) rather than a chain of
# "if (r == CUDA_SUCCESS) r = need_ctx(fn);" statements.
#
# -D: TESTDEVICE (the testdevice/ folder of the sources).
set(max_lines 900)
file(GLOB sources ${TESTDEVICE}/*.c ${TESTDEVICE}/*.h)
if(NOT sources)
  message(FATAL_ERROR "no sources in ${TESTDEVICE}")
endif()
set(checks "need_init|need_ctx|device_ok|need_stream|event_ok|pool_ok|module_ok|func_ok|graph_ok|exec_ok")
set(problems "")
foreach(source ${sources})
  get_filename_component(name ${source} NAME)
  file(READ ${source} text)
  string(REGEX MATCHALL "\n" newlines "${text}")
  list(LENGTH newlines n)
  if(n GREATER max_lines)
    string(APPEND problems "  testdevice/${name}: ${n} lines (at most ${max_lines})\n")
  endif()
  string(REGEX MATCHALL "\n +(CUresult )?r = (${checks})\\([^\n;]*" outside "${text}")
  foreach(line IN LISTS outside)
    string(STRIP "${line}" line)
    string(APPEND problems "  testdevice/${name}: a check outside CHECKS: ${line}\n")
  endforeach()
endforeach()
if(problems)
  message(FATAL_ERROR "the test device's layout:\n${problems}")
endif()
