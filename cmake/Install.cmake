# `cmake --install build --prefix PREFIX`: an install tree a centre can load as an environment module.
#   PREFIX/bin/                          mgbench, mgbench-report, mgbench-plot
#   PREFIX/lib/mgbench/python/           the Python package mgbench_analysis (frames, figures)
#   PREFIX/share/mgbench/{slurm,inputs}  the sbatch scripts and example configurations
#   PREFIX/share/doc/mgbench/            README and docs
#   PREFIX/modulefiles/mgbench/<version>.lua   the Lmod modulefile (relocatable: it finds PREFIX itself)
# The binaries keep their run paths to the libraries they were linked with (LibTorch, NCCL, MPI,
# HDF5: CMAKE_INSTALL_RPATH_USE_LINK_PATH, set before the targets in CMakeLists.txt).
configure_file("${PROJECT_SOURCE_DIR}/cmake/mgbench-plot.in" "${PROJECT_BINARY_DIR}/install/mgbench-plot" @ONLY)
install(PROGRAMS "${PROJECT_BINARY_DIR}/install/mgbench-plot" DESTINATION bin)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/python/mgbench_analysis" DESTINATION lib/mgbench/python
        FILES_MATCHING PATTERN "*.py" PATTERN "*.txt" PATTERN "*.csv" PATTERN "__pycache__" EXCLUDE)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/slurm/" DESTINATION share/mgbench/slurm USE_SOURCE_PERMISSIONS)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/inputs/" DESTINATION share/mgbench/inputs)
install(FILES "${PROJECT_SOURCE_DIR}/README.md" DESTINATION share/doc/mgbench)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/docs/" DESTINATION share/doc/mgbench/docs)
configure_file("${PROJECT_SOURCE_DIR}/cmake/mgbench.lua.in"
               "${PROJECT_BINARY_DIR}/install/modulefiles/mgbench/${PROJECT_VERSION}.lua" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/install/modulefiles/mgbench/${PROJECT_VERSION}.lua"
        DESTINATION modulefiles/mgbench)
