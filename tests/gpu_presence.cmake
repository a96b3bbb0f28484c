# The GPU programs' skip rule (tests/gpu_presence.h), checked on a GPU test program run
# three ways: no driver (skipped, 77), a driver that sees no device (skipped, 77), and a
# driver that is installed but broken (FAILED, 1: a broken GPU machine must not pass).
#   cmake -DPROGRAM=... -DSTUB=... -DTESTDEVICE=... -P gpu_presence.cmake
function(expect want_rc want_text)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${ARGN} ${PROGRAM}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL want_rc)
    message(FATAL_ERROR "${ARGN}: exit ${rc}, expected ${want_rc}\n${out}${err}")
  endif()
  string(FIND "${out}" "${want_text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${ARGN}: the output lacks '${want_text}':\n${out}${err}")
  endif()
  message(STATUS "${ARGN}: exit ${rc}: ${out}")
endfunction()

expect(77 "skipped: sc_device_count: cannot load" SAFECUDA_LIBCUDA=/nonexistent/libcuda.so.1)
expect(77 "skipped: the CUDA driver sees no device" SAFECUDA_LIBCUDA=${TESTDEVICE}
       SAFECUDA_TESTDEVICE_DEVICES=0)
expect(1 "FAILED: the driver is there but sc_device_count answered SC_ERR_DRIVER"
       SAFECUDA_LIBCUDA=${STUB} SAFECUDA_STUB_INIT_RESULT=999)
