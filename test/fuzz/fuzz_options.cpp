// Sanitizer defaults of every nf fuzzer (linked into each by nf_add_fuzzer),
// so that ctest's corpus replay and scripts/fuzz.sh run under the same rules.
// ASAN_OPTIONS in the environment still override them.

extern "C" const char *__asan_default_options() {
  // allocator_may_return_null + max_allocation_size_mb: a malloc larger than
  // 1 GiB (an arena sized by a hostile plan) returns null, which the runtime
  // must handle, instead of counting as a crash. operator new still aborts
  // under ASan, so sizes must be checked before they reach a container.
  return "allocator_may_return_null=1:max_allocation_size_mb=1024:"
         "detect_leaks=1:strict_string_checks=1";
}

extern "C" const char *__ubsan_default_options() {
  return "print_stacktrace=1:halt_on_error=1";
}
