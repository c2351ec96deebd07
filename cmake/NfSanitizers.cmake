# Sanitizer and fuzzer builds (docs/reliability.md).
#
# NF_SANITIZE: every target of the build (libraries, tools, tests) compiled
# and linked with AddressSanitizer and UndefinedBehaviorSanitizer. Undefined
# behaviour aborts (-fno-sanitize-recover) so that a test that hits it fails
# instead of printing a line nobody reads.
#
# NF_BUILD_FUZZERS: the libFuzzer targets of test/fuzz (clang only). Every
# target of the build gets the sanitizers and the fuzzer's coverage
# instrumentation (-fsanitize=fuzzer-no-link); the fuzzer executables link
# libFuzzer's main (-fsanitize=fuzzer). nf_add_fuzzer() adds one.

option(NF_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
option(NF_BUILD_FUZZERS "Build the libFuzzer targets of test/fuzz (needs clang)" OFF)

set(NF_SANITIZER_FLAGS
  -fsanitize=address,undefined
  -fno-sanitize-recover=undefined
  -fno-omit-frame-pointer)

if(NF_BUILD_FUZZERS AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR
    "NF_BUILD_FUZZERS needs clang (libFuzzer): configure with "
    "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
endif()

if(NF_SANITIZE OR NF_BUILD_FUZZERS)
  add_compile_options(${NF_SANITIZER_FLAGS} -g)
  add_link_options(${NF_SANITIZER_FLAGS})
endif()
if(NF_BUILD_FUZZERS)
  add_compile_options(-fsanitize=fuzzer-no-link
    -fsanitize-coverage-ignorelist=${PROJECT_SOURCE_DIR}/test/fuzz/coverage_ignorelist.txt)
  add_link_options(-fsanitize=fuzzer-no-link)
endif()

# nf_add_fuzzer(<name> <source>... LIBS <library>...)
#
# Builds the libFuzzer executable nf-fuzz-<name> from the sources (which
# define LLVMFuzzerTestOneInput) and registers its seed corpus,
# test/fuzz/corpus/<name>/ (which must exist), as the ctest test
# fuzz-corpus-<name>: every seed runs once, so a crash input added there
# stays a regression test. scripts/fuzz.sh fuzzes every nf-fuzz-* target.
function(nf_add_fuzzer name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "" "LIBS")
  set(sources ${ARG_UNPARSED_ARGUMENTS})
  if(NOT sources)
    message(FATAL_ERROR "nf_add_fuzzer(${name}): no sources")
  endif()
  set(corpus ${PROJECT_SOURCE_DIR}/test/fuzz/corpus/${name})
  if(NOT IS_DIRECTORY ${corpus})
    message(FATAL_ERROR "nf_add_fuzzer(${name}): no seed corpus ${corpus}")
  endif()
  set(target nf-fuzz-${name})
  add_executable(${target} ${sources} ${PROJECT_SOURCE_DIR}/test/fuzz/fuzz_options.cpp)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/test/fuzz)
  target_link_libraries(${target} PRIVATE ${ARG_LIBS})
  target_link_options(${target} PRIVATE -fsanitize=fuzzer)
  target_compile_definitions(${target} PRIVATE
    NF_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(NOT TARGET nf-fuzzers)
    add_custom_target(nf-fuzzers)
  endif()
  add_dependencies(nf-fuzzers ${target})
  # -runs=0: run the seeds, no fuzzing (nothing is written to the corpus).
  add_test(NAME fuzz-corpus-${name}
    COMMAND ${target} -runs=0 ${corpus})
  set_tests_properties(fuzz-corpus-${name} PROPERTIES LABELS fuzz TIMEOUT 600)
endfunction()
