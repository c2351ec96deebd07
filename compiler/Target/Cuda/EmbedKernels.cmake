# Writes OUT: one C++ initializer {"name", R"(text)"} per kernels/*.h and
# kernels/*.cuh file of KERNELS_DIR, sorted by name (see KernelHeaders.cpp).
# Usage: cmake -DKERNELS_DIR=<dir> -DOUT=<file> -P EmbedKernels.cmake
file(GLOB files RELATIVE "${KERNELS_DIR}" "${KERNELS_DIR}/*.h" "${KERNELS_DIR}/*.cuh")
list(SORT files)
set(content "// Generated from kernels/ by compiler/Target/Cuda/EmbedKernels.cmake.\n")
foreach(f IN LISTS files)
  file(READ "${KERNELS_DIR}/${f}" text)
  string(FIND "${text}" ")nf_kernel_src\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${f} contains the raw-string delimiter")
  endif()
  string(APPEND content "{\"${f}\", R\"nf_kernel_src(${text})nf_kernel_src\"},\n")
endforeach()
file(WRITE "${OUT}.tmp" "${content}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
