# mgbench_warnings(<target>): the warning set every mgbench target compiles with.
function(mgbench_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()

# mgbench_use_torch_pch(<target>): reuse the precompiled LibTorch header of mgbench_torch_pch.
function(mgbench_use_torch_pch target)
  target_link_libraries(${target} PUBLIC mgbench_torch_pch)
  if(MGBENCH_USE_PCH)
    target_precompile_headers(${target} REUSE_FROM mgbench_torch_pch)
  endif()
endfunction()
