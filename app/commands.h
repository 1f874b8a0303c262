#pragma once
// The commands with files of their own (the MPI commands, and report, which mgbench-report shares);
// each gets argv without the program name and returns the exit code. main.cpp has the others.
namespace mgbench::app {
int image_main(int argc, char** argv);
int report_main(int argc, char** argv);
int llm_main(int argc, char** argv);
int comm_main(int argc, char** argv);
int predict_main(int argc, char** argv);
}  // namespace mgbench::app
