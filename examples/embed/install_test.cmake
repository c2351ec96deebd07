# ctest driver (cmake -P) of the embedding example: installs the nf build
# into a fresh prefix, configures and builds examples/embed against the
# installed package with find_package(nf CONFIG), and runs it on a plan.
# When nfc is installed too (a build with the compiler), the installed nfc
# must start and compile MODEL_DIR, and the example runs that plan as well.
#
# Variables (-D):
#   NF_BUILD_DIR   the nf build tree to install (required)
#   WORK_DIR       scratch directory, recreated (required)
#   GENERATOR      CMake generator for the example (default: Ninja)
#   C_COMPILER     C compiler for the example (optional)
#   CXX_COMPILER   C++ compiler for the example (optional)
#   PLAN           plan to run; empty: compiled here from MODEL_DIR with NFC
#   NFC            nfc executable (used when PLAN is empty)
#   MODEL_DIR      checkpoint directory: the weights (and tokenizer)
#
# Prints "SKIPPED: ..." (the test's skip regex) when there is no plan to run.

foreach(var NF_BUILD_DIR WORK_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "install_test.cmake: ${var} is not set")
  endif()
endforeach()
if(NOT GENERATOR)
  set(GENERATOR Ninja)
endif()
get_filename_component(EXAMPLE_DIR "${CMAKE_CURRENT_LIST_DIR}" ABSOLUTE)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  set(run_output "${out}${err}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

# 1. Install.
run(${CMAKE_COMMAND} --install "${NF_BUILD_DIR}" --prefix "${prefix}")
foreach(f include/nf/nf.h include/nf/nf.hpp include/nf/status.h)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "not installed: ${prefix}/${f}")
  endif()
endforeach()
file(GLOB headers RELATIVE "${prefix}/include" "${prefix}/include/nf/*")
list(SORT headers)
if(NOT headers STREQUAL "nf/nf.h;nf/nf.hpp;nf/status.h")
  message(FATAL_ERROR "unexpected installed headers: ${headers}")
endif()
file(GLOB_RECURSE config "${prefix}/*/nfConfig.cmake")
if(NOT config)
  message(FATAL_ERROR "nfConfig.cmake not installed under ${prefix}")
endif()

# 2. Configure and build the example against the installed package only.
set(configure_args -S "${EXAMPLE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_BUILD_TYPE=Release)
if(C_COMPILER)
  list(APPEND configure_args "-DCMAKE_C_COMPILER=${C_COMPILER}")
endif()
if(CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
run(${CMAKE_COMMAND} ${configure_args})
message(STATUS "${run_output}")
run(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
set(embed "${WORK_DIR}/build/embed")

# 3. A plan: the one given, or compiled here.
if(NOT PLAN)
  if(NOT NFC OR NOT EXISTS "${NFC}")
    message(STATUS "SKIPPED: no plan given and no nfc to compile one")
    return()
  endif()
  set(PLAN "${WORK_DIR}/model.nfb")
  run("${NFC}" import "${MODEL_DIR}" -o "${WORK_DIR}/model.mlir")
  run("${NFC}" compile "${WORK_DIR}/model.mlir" -o "${PLAN}"
      --max-tokens 256 --max-sequences 4 --kv-pages 64)
endif()
if(NOT EXISTS "${PLAN}")
  message(STATUS "SKIPPED: plan ${PLAN} does not exist")
  return()
endif()

# 4. Run it.
function(run_example plan)
  set(args "${plan}")
  if(MODEL_DIR)
    list(APPEND args "${MODEL_DIR}")
  endif()
  run("${embed}" ${args})
  message(STATUS "${run_output}")
  if(NOT run_output MATCHES "generated [1-9][0-9]* tokens")
    message(FATAL_ERROR "the example generated nothing")
  endif()
  run("${WORK_DIR}/build/embed_c" ${args})
  message(STATUS "${run_output}")
endfunction()
run_example("${PLAN}")

# 5. The installed nfc: it must find its shared libraries (MLIR, LLVM) from
# the prefix, without the build tree's RUNPATH.
set(installed_nfc "${prefix}/bin/nfc")
if(EXISTS "${installed_nfc}" AND MODEL_DIR)
  run("${installed_nfc}" --version)
  if(NOT run_output MATCHES "^nfc [0-9]+\\.[0-9]+")
    message(FATAL_ERROR "installed nfc --version printed: ${run_output}")
  endif()
  run("${installed_nfc}" import "${MODEL_DIR}" -o "${WORK_DIR}/installed.mlir")
  run("${installed_nfc}" compile "${WORK_DIR}/installed.mlir"
      -o "${WORK_DIR}/installed.nfb" --max-tokens 256 --max-sequences 4
      --kv-pages 64)
  run_example("${WORK_DIR}/installed.nfb")
endif()
