# Writes OUTPUT, a C++ header holding each of FILES (a ;-list) as a raw string literal, byte for
# byte, in a table of {name (the file's name without its extension), text} rows, in namespace
# NAMESPACE: text files the binary needs (the recipes' default configurations), built in so that it
# runs from any directory and never reads them. LABEL says in the header where they come from. Run
# at build time (modules/train/CMakeLists.txt), only when one of the files changed:
#   cmake "-DFILES=<a.ini;b.ini>" -DLABEL=<text> -DOUTPUT=<header> -DNAMESPACE=<ns> -P cmake/EmbedText.cmake
set(delimiter "mgbench_embedded")
set(rows "")
foreach(path IN LISTS FILES)
  get_filename_component(name "${path}" NAME_WE)
  file(READ "${path}" text)
  string(FIND "${text}" ")${delimiter}\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${path} contains ')${delimiter}\"', which ends the raw string it is embedded in")
  endif()
  string(APPEND rows "    {\"${name}\", R\"${delimiter}(${text})${delimiter}\"},\n")
endforeach()
set(header "#pragma once
// Generated at build time by cmake/EmbedText.cmake from ${LABEL}: do not edit.
#include <string_view>

namespace ${NAMESPACE} {

struct EmbeddedFile {
  std::string_view name;  // the file's name without its extension
  std::string_view text;  // the file, byte for byte
};

inline constexpr EmbeddedFile kFiles[] = {
${rows}};

}  // namespace ${NAMESPACE}
")
file(WRITE "${OUTPUT}" "${header}")
