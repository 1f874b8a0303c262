#pragma once
// One function per subcommand; each gets argv without the program name and returns the exit code.
namespace mgbench::app {
int image_main(int argc, char** argv);
int report_main(int argc, char** argv);
int tokenize_main(int argc, char** argv);
int data_main(int argc, char** argv);
int llm_main(int argc, char** argv);
int quantize_main(int argc, char** argv);
int comm_main(int argc, char** argv);
int predict_main(int argc, char** argv);
}  // namespace mgbench::app
