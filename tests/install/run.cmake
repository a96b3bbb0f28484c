# The installed tree, used exactly as the README says, by programs that then run WITHOUT
# LD_LIBRARY_PATH (the link records the install's libdir):
#   1. BUILD_DIR installed with `cmake --install BUILD_DIR --prefix PREFIX` (libdir lib);
#   2. SOURCE_DIR built again as a Debian package is (-DCMAKE_INSTALL_PREFIX=/usr
#      -DCMAKE_INSTALL_LIBDIR=lib/<multiarch>, library only) and installed with DESTDIR.
# For each: a consumer through find_package (CMAKE_PREFIX_PATH; the shared and the static
# target) and through pkg-config (`cc app.c $(pkg-config --cflags --libs safecuda)` with
# PKG_CONFIG_PATH), and the README's test-device example (examples/testdevice_test.c)
# built the same ways and run with SAFECUDA_DEVICE=test against the installed test device.
#
# -D: BUILD_DIR, SOURCE_DIR, WORK_DIR, CONSUMER_DIR, C_COMPILER, MULTIARCH (the compiler's
# library architecture, e.g. x86_64-linux-gnu; empty where there is none).
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(example ${SOURCE_DIR}/examples/testdevice_test.c)
cmake_host_system_information(RESULT jobs QUERY NUMBER_OF_LOGICAL_CORES)

# run(cmd...): cmd in an environment without LD_LIBRARY_PATH or the safecuda variables of
# the caller (ENV NAME=VALUE before cmd adds one); it must succeed. OUT names a variable
# for its output.
function(run)
  cmake_parse_arguments(R "" "OUT;ENV" "" ${ARGN})
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
                          --unset=SAFECUDA_LIBCUDA --unset=SAFECUDA_DEVICE ${R_ENV}
                          ${R_UNPARSED_ARGUMENTS}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REPLACE ";" " " cmd "${R_ENV} ${R_UNPARSED_ARGUMENTS}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  message(STATUS "ok: ${cmd}\n${out}")
  if(R_OUT)
    set(${R_OUT} "${out}" PARENT_SCOPE)
  endif()
endfunction()

find_program(PKG_CONFIG pkg-config)
set(skipped "")

# check(prefix libdir name): the files are there, then every consumer builds and runs.
function(check prefix libdir name)
  set(work ${WORK_DIR}/use-${name})
  foreach(f include/safecuda.h include/safecuda/moe.h include/safecuda/quant.h
            include/safecuda/comm.h bin/safecuda
            ${libdir}/pkgconfig/safecuda.pc ${libdir}/cmake/safecuda/safecudaConfig.cmake
            ${libdir}/libsafecuda.a ${libdir}/libsafecuda.so
            ${libdir}/libsafecuda_testdevice.so)
    if(NOT EXISTS ${prefix}/${f})
      message(FATAL_ERROR "${name}: not installed: ${prefix}/${f}")
    endif()
  endforeach()

  # find_package, as the README shows it.
  run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${work}/consumer -DCMAKE_PREFIX_PATH=${prefix}
      -DCMAKE_C_COMPILER=${C_COMPILER} -DTESTDEVICE_EXAMPLE=${example})
  run(${CMAKE_COMMAND} --build ${work}/consumer)
  foreach(kind shared static)
    run(${work}/consumer/consumer_${kind})
    run(ENV SAFECUDA_DEVICE=test ${work}/consumer/testdevice_test_${kind}
        OUT out)
    if(NOT out MATCHES "testdevice_test: all checks passed")
      message(FATAL_ERROR "${name}: testdevice_test_${kind} did not pass:\n${out}")
    endif()
  endforeach()

  # pkg-config, as the README shows it.
  if(NOT PKG_CONFIG)
    set(skipped "${skipped} ${name}:pkg-config" PARENT_SCOPE)
    return()
  endif()
  set(pc_env PKG_CONFIG_PATH=${prefix}/${libdir}/pkgconfig)
  run(ENV ${pc_env} ${PKG_CONFIG} --variable=libdir safecuda OUT pc_libdir)
  string(STRIP "${pc_libdir}" pc_libdir)
  file(REAL_PATH "${pc_libdir}" pc_libdir)
  file(REAL_PATH "${prefix}/${libdir}" want_libdir)
  if(NOT pc_libdir STREQUAL want_libdir)
    message(FATAL_ERROR "${name}: pkg-config's libdir is ${pc_libdir}, not ${want_libdir}")
  endif()
  run(ENV ${pc_env} sh -c
      "${C_COMPILER} ${CONSUMER_DIR}/consumer.c $(${PKG_CONFIG} --cflags --libs safecuda) -o ${work}/app")
  run(${work}/app)
  run(ENV ${pc_env} sh -c
      "${C_COMPILER} ${example} $(${PKG_CONFIG} --cflags --libs safecuda) -o ${work}/testdevice_test")
  run(ENV SAFECUDA_DEVICE=test ${work}/testdevice_test OUT out)
  if(NOT out MATCHES "testdevice_test: all checks passed")
    message(FATAL_ERROR "${name}: testdevice_test (pkg-config) did not pass:\n${out}")
  endif()
endfunction()

# test_device_found(name cmd...): cmd, run with SAFECUDA_DEVICE=test, finds the test device
# (its output names it) and succeeds.
function(test_device_found name)
  run(ENV SAFECUDA_DEVICE=test ${ARGN} OUT out)
  if(NOT out MATCHES "safecuda test device \\(host memory, runs no kernels\\)")
    message(FATAL_ERROR "${name}: did not find the test device:\n${out}")
  endif()
endfunction()

# cli_finds_test_device(prefix name): the installed command finds the installed test device
# run by its path, through PATH (argv[0] without a folder), and through a symbolic link in
# another folder (resolved to the installed file).
function(cli_finds_test_device prefix name)
  test_device_found("${name}: bin/safecuda info" ${prefix}/bin/safecuda info)
  test_device_found("${name}: safecuda info through PATH"
                    sh -c "PATH='${prefix}/bin':\"$PATH\" exec safecuda info")
  set(elsewhere ${WORK_DIR}/elsewhere-${name})
  file(MAKE_DIRECTORY ${elsewhere})
  file(CREATE_LINK ${prefix}/bin/safecuda ${elsewhere}/safecuda SYMBOLIC)
  test_device_found("${name}: a link to bin/safecuda" ${elsewhere}/safecuda info)
endfunction()

# 1. The build, installed into a prefix of its own.
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
check(${WORK_DIR}/prefix lib prefix)
run(${WORK_DIR}/prefix/bin/safecuda version)
cli_finds_test_device(${WORK_DIR}/prefix prefix)

# The build tree's own programs find the build's test device too: the command through PATH,
# and a benchmark (in a folder of its own) by its path.
test_device_found("build: safecuda info through PATH"
                  sh -c "PATH='${BUILD_DIR}':\"$PATH\" exec safecuda info")
if(EXISTS ${BUILD_DIR}/bench/bench_memory)
  run(ENV SAFECUDA_DEVICE=test sh -c
      "SAFECUDA_BENCH_NO_PEER=1 exec '${BUILD_DIR}/bench/bench_memory' --quick" OUT out)
  if(NOT out MATCHES "bench_memory[^\n]*: safecuda test device")
    message(FATAL_ERROR "build: bench_memory did not find the test device:\n${out}")
  endif()
endif()

# 2. A Debian-style package: prefix /usr, a multiarch libdir, staged with DESTDIR.
if(NOT MULTIARCH)
  set(MULTIARCH x86_64-linux-gnu)
endif()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/deb-build -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_INSTALL_PREFIX=/usr
    -DCMAKE_INSTALL_LIBDIR=lib/${MULTIARCH} -DSAFECUDA_BUILD_TESTS=OFF
    -DSAFECUDA_BUILD_BENCH=OFF -DSAFECUDA_BUILD_EXAMPLES=OFF)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/deb-build -j ${jobs})
run(ENV DESTDIR=${WORK_DIR}/stage ${CMAKE_COMMAND} --install ${WORK_DIR}/deb-build)
check(${WORK_DIR}/stage/usr lib/${MULTIARCH} multiarch)
cli_finds_test_device(${WORK_DIR}/stage/usr multiarch)

if(skipped)
  message(STATUS "SKIPPED: pkg-config not found, not checked for:${skipped}")
endif()
