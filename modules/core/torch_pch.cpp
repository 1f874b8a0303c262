// Translation unit that owns the precompiled LibTorch header (see core/CMakeLists.txt).
