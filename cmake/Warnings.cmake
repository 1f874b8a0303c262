# mgbench_warnings(<target>): the warning set every mgbench target compiles with.
function(mgbench_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()
