# mgbench_warnings(<target>): the warning set every mgbench target compiles with; with
# -DMGBENCH_WERROR=ON (CI: scripts/test.sh) warnings in the project's own code are errors
# (third-party headers are system includes and stay out of it).
option(MGBENCH_WERROR "Treat warnings in mgbench's own code as errors" OFF)
function(mgbench_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter -Wundef)
  if(MGBENCH_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# mgbench_use_torch_pch(<target>): reuse the precompiled LibTorch header of mgbench_torch_pch.
function(mgbench_use_torch_pch target)
  target_link_libraries(${target} PUBLIC mgbench_torch_pch)
  if(MGBENCH_USE_PCH)
    target_precompile_headers(${target} REUSE_FROM mgbench_torch_pch)
  endif()
endfunction()
