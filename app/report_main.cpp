// mgbench-report: `mgbench report` as a binary without LibTorch (nor CUDA), for login nodes and
// laptops that only analyse results files. Same options as `mgbench report`.
#include "commands.h"

int main(int argc, char** argv) { return mgbench::app::report_main(argc, argv); }
