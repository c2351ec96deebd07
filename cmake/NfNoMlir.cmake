# The runtime must never link MLIR or LLVM: an embedder gets a small library
# with no compiler inside. Targets that belong to the runtime register here and
# the configure step fails if any of their (transitive) link dependencies is
# an MLIR or LLVM library.

set_property(GLOBAL PROPERTY NF_RUNTIME_TARGETS "")

function(nf_runtime_target target)
  set_property(GLOBAL APPEND PROPERTY NF_RUNTIME_TARGETS ${target})
endfunction()

function(_nf_collect_link_deps target out_var)
  set(seen "")
  set(queue ${target})
  while(queue)
    list(POP_FRONT queue item)
    if(item IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${item})
    if(TARGET ${item})
      get_target_property(libs ${item} LINK_LIBRARIES)
      get_target_property(ilibs ${item} INTERFACE_LINK_LIBRARIES)
      foreach(l IN LISTS libs ilibs)
        if(l AND NOT l MATCHES "-NOTFOUND$")
          string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" l "${l}")
          list(APPEND queue ${l})
        endif()
      endforeach()
    endif()
  endwhile()
  set(${out_var} ${seen} PARENT_SCOPE)
endfunction()

function(nf_check_runtime_targets_free_of_mlir)
  get_property(targets GLOBAL PROPERTY NF_RUNTIME_TARGETS)
  foreach(t IN LISTS targets)
    _nf_collect_link_deps(${t} deps)
    foreach(d IN LISTS deps)
      if(d MATCHES "(^|[/:])(MLIR|LLVM|lib(MLIR|LLVM))" OR d MATCHES "llvm-[0-9]+")
        message(FATAL_ERROR
          "runtime target '${t}' links '${d}': the runtime must not depend on MLIR or LLVM")
      endif()
    endforeach()
  endforeach()
endfunction()
