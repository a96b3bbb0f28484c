# The benchmarks use safecuda through its public API only: no file in bench/ includes a
# header of src/ (the library's internals) or names an internal sci_ function. The raw
# driver baselines load libcuda themselves (bench/raw_driver.c); safecuda's handles reach
# them through the documented escape hatches (sc_stream_cu_handle, sc_buffer_device_ptr).
# The benchmarks are also built without src/ on their include path (bench/CMakeLists.txt);
# this also catches a src/ header reached by a relative path and a call of an sci_ function
# that the static library would link.
#
# -D: SOURCE_DIR (the project), BENCH_DIR (the folder to check; default SOURCE_DIR/bench).
if(NOT BENCH_DIR)
  set(BENCH_DIR ${SOURCE_DIR}/bench)
endif()
file(GLOB_RECURSE files ${BENCH_DIR}/*.c ${BENCH_DIR}/*.h)
if(NOT files)
  message(FATAL_ERROR "no C sources found under ${BENCH_DIR}")
endif()
set(problems "")
foreach(f ${files})
  file(RELATIVE_PATH rel ${BENCH_DIR} ${f})
  file(STRINGS ${f} lines)
  set(n 0)
  foreach(line IN LISTS lines)
    math(EXPR n "${n} + 1")
    if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">]")
      set(inc ${CMAKE_MATCH_1})
      get_filename_component(dir ${f} DIRECTORY)
      if(inc MATCHES "(^|/)src/" OR (EXISTS ${SOURCE_DIR}/src/${inc} AND
         NOT EXISTS ${dir}/${inc} AND NOT EXISTS ${SOURCE_DIR}/include/${inc}))
        string(APPEND problems "  ${rel}:${n}: includes the internal header ${inc}\n")
      endif()
    endif()
    if(line MATCHES "(^|[^A-Za-z0-9_])(sci_[A-Za-z0-9_]+)")
      string(APPEND problems "  ${rel}:${n}: names the internal ${CMAKE_MATCH_2}\n")
    endif()
  endforeach()
endforeach()
if(problems)
  message(FATAL_ERROR "bench/ reaches under safecuda's public API (use include/ and its "
          "escape hatches; raw driver baselines through bench/raw_driver.h):\n${problems}")
endif()
