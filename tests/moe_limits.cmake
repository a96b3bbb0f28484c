# The MoE layer's limits (SC_MOE_MAX_*) are defined once, in include/safecuda/moe.h; the
# kernels' copy (kernels/moe/moe_config.cuh) and the Python package's (python/safecuda/_lib.py)
# are checked against it at build time by cmake/check_moe_limits.cmake. Here: the sources
# agree, and a copy that differs (or lacks a limit) stops the check with the file, the name
# and both values.
#
# -D: SOURCE_DIR, WORK_DIR.
set(header ${SOURCE_DIR}/include/safecuda/moe.h)
set(config ${SOURCE_DIR}/kernels/moe/moe_config.cuh)
set(python ${SOURCE_DIR}/python/safecuda/_lib.py)
set(check ${SOURCE_DIR}/cmake/check_moe_limits.cmake)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run_check header config python out_rc out_text)
  execute_process(COMMAND ${CMAKE_COMMAND} -DHEADER=${header} -DCONFIG=${config}
                          -DPYTHON=${python} -DSTAMP=${WORK_DIR}/stamp -P ${check}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_rc} ${rc} PARENT_SCOPE)
  set(${out_text} "${out}${err}" PARENT_SCOPE)
endfunction()

# The sources as they are: they agree.
run_check(${header} ${config} ${python} rc text)
if(NOT rc EQUAL 0 OR NOT EXISTS ${WORK_DIR}/stamp)
  message(FATAL_ERROR "the MoE limits of the sources disagree (exit ${rc}):\n${text}")
endif()

# A copy that differs: refused, naming the file, the limit and both values.
function(expect_refused what file from to want)
  file(READ ${file} text)
  string(REPLACE "${from}" "${to}" changed "${text}")
  if(changed STREQUAL text)
    message(FATAL_ERROR "${what}: '${from}' is not in ${file}")
  endif()
  get_filename_component(name ${file} NAME)
  file(WRITE ${WORK_DIR}/${name} "${changed}")
  set(h ${header})
  set(c ${config})
  set(p ${python})
  if(name STREQUAL "moe.h")
    set(h ${WORK_DIR}/${name})
  elseif(name STREQUAL "moe_config.cuh")
    set(c ${WORK_DIR}/${name})
  else()
    set(p ${WORK_DIR}/${name})
  endif()
  run_check(${h} ${c} ${p} rc out)
  string(FIND "${out}" "${want}" at)
  if(rc EQUAL 0 OR at EQUAL -1)
    message(FATAL_ERROR "${what}: exit ${rc}, output lacks '${want}':\n${out}")
  endif()
endfunction()
expect_refused("the kernels' experts" ${config} "#define SC_MOE_MAX_EXPERTS 512"
               "#define SC_MOE_MAX_EXPERTS 256"
               "moe_config.cuh: SC_MOE_MAX_EXPERTS is 256, include/safecuda/moe.h says 512")
expect_refused("the header's top-k" ${header} "#define SC_MOE_MAX_TOPK 16"
               "#define SC_MOE_MAX_TOPK 32"
               "moe_config.cuh: SC_MOE_MAX_TOPK is 16, include/safecuda/moe.h says 32")
expect_refused("Python's shared" ${python} "= 512, 16, 16" "= 512, 16, 8"
               "_lib.py: SC_MOE_MAX_SHARED is 8, include/safecuda/moe.h says 16")
expect_refused("Python's steps" ${python} "SC_MOE_MAX_STEPS = 16" "SC_MOE_MAX_STEPS = 12"
               "_lib.py: SC_MOE_MAX_STEPS is 12, include/safecuda/moe.h says 16")
expect_refused("a limit missing" ${config} "#define SC_MOE_MAX_TOPK 16" "#define SC_MOE_TOPK 16"
               "moe_config.cuh: SC_MOE_MAX_TOPK is not defined, include/safecuda/moe.h says 16")
message(STATUS "the MoE limits agree, and a difference is caught")
